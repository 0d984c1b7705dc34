"""Where kattn keeps the data sets it generates (the embedded ListOps, image and text sets),
and how a generated set gets there exactly once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where generated data is kept: ``$KATTN_CACHE`` or ``~/.cache/kattn``."""
    root = os.environ.get("KATTN_CACHE") or Path.home() / ".cache" / "kattn"
    return Path(root)


def parameters_key(params: Mapping[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of ``params`` as sorted JSON: a set generated
    from other parameters gets another folder."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def generated_folder(folder: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """``folder``, first filled by ``write(partial)`` unless its file ``marker`` exists.

    ``write`` fills a temporary sibling folder, which is then renamed to ``folder``: a
    concurrent or interrupted first use never leaves a half-written set behind. The temporary
    folder is removed when ``write`` fails or another process renamed its own first.
    """
    if (folder / marker).exists():
        return folder
    partial = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        write(partial)
        try:
            partial.rename(folder)
        except OSError:  # another process finished first
            if not (folder / marker).exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already after the rename
    return folder
