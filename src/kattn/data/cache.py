"""Where kattn keeps the data sets it generates (the embedded ListOps and image sets)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where generated data is kept: ``$KATTN_CACHE`` or ``~/.cache/kattn``."""
    root = os.environ.get("KATTN_CACHE") or Path.home() / ".cache" / "kattn"
    return Path(root)
