"""Argument types of ``kattn bench`` and ``kattn demo``: each checks its value while the command
line is parsed, so a bad one stops the command (exit code 2, one line naming the argument and
what was expected) before any work runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch


def _bad(text: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _bad(text, f"an integer >= {low}") from None
        if value < low:
            raise _bad(text, f"an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text: str) -> float:
    """A finite number > 0 (not 0, negative, nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        raise _bad(text, "a finite number > 0") from None
    if not (math.isfinite(value) and value > 0):
        raise _bad(text, "a finite number > 0")
    return value


def _items(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise _bad(text, f"a comma-separated list of {what}")
    return items


def int_list(low: int) -> Callable[[str], tuple[int, ...]]:
    """A non-empty comma-separated list of integers >= ``low``."""
    what = f"integers >= {low}"

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in _items(text, what))
        except ValueError:
            raise _bad(text, f"a comma-separated list of {what}") from None
        if min(values) < low:
            raise _bad(text, f"a comma-separated list of {what}")
        return values

    parse.__name__ = f"list of {what}"
    return parse


def positive_float_list(text: str) -> tuple[float, ...]:
    """A non-empty comma-separated list of finite numbers > 0."""
    what = "finite numbers > 0"
    try:
        values = tuple(float(x) for x in _items(text, what))
    except ValueError:
        raise _bad(text, f"a comma-separated list of {what}") from None
    if not all(math.isfinite(x) and x > 0 for x in values):
        raise _bad(text, f"a comma-separated list of {what}")
    return values


def name_list(text: str) -> str:
    """A comma-separated list with at least one name (kept as text: each command checks the
    names against what it knows)."""
    return ",".join(_items(text, "names"))


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` (CUDA only where it is available)."""
    expected = "cpu, cuda or cuda:N"
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise _bad(text, expected) from None
    if dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise _bad(text, expected)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise _bad(text, f"{expected}; CUDA is not available on this machine")
    return str(dev)


def output_folder(text: str) -> Path:
    """A folder that exists or can be made: neither the path nor any parent is a file."""
    path = Path(text)
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                raise argparse.ArgumentTypeError(
                    f"expected a folder to write results in, got {text!r}: {place} is a file"
                )
            break
    return path
