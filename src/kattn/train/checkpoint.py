"""Checkpoints written atomically: to a temporary file in the same folder, then renamed, so
an interrupted write never leaves a truncated checkpoint behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

LAST = "last.pt"
BEST = "best.pt"


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save(state)`` to ``path`` atomically."""
    atomic_write(path, lambda file: torch.save(state, file))


def save_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON at ``path``, atomically."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write(path, lambda file: file.write(text.encode()))


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint` (tensors on ``device``)."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state: dict[str, Any] = torch.load(path, map_location=device, weights_only=False)
    return state
