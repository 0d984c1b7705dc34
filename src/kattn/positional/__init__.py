"""Relative positional encodings for kernelized attention (``kernelized(rpe=...)``).

``available()`` lists them; ``build(name, num_heads=..., max_len=..., **options)`` makes one,
which can be passed as ``rpe=`` to several attention modules to share it across layers.
"""

from __future__ import annotations

from typing import Any

from ..registry import ENCODINGS, import_modules, register_encoding
from .base import RelativePositionBias
from .bucketed import BucketedBias, t5_buckets
from .decay import DecayBias
from .toeplitz import Toeplitz2dBias, ToeplitzBias

#: the modules of shared machinery, which register nothing (every other module must register)
SUPPORT_MODULES = ("base",)
MODULES = import_modules(__name__, __path__)


def available() -> list[str]:
    """Registered encoding names, sorted."""
    return ENCODINGS.available()


def get(name: str) -> type[RelativePositionBias]:
    """The class registered as ``name`` (``ValueError`` naming the valid ones otherwise)."""
    return ENCODINGS.get(name).cls


def option_names(name: str) -> list[str]:
    """The options encoding ``name`` accepts (besides ``num_heads`` and ``max_len``)."""
    return ENCODINGS.option_names(name) or []


def build(
    name: str, *, num_heads: int, max_len: int | None = None, **options: Any
) -> RelativePositionBias:
    """Build encoding ``name`` with per-head parameters; unknown options, and bool or number
    options of another type, raise ``TypeError``."""
    return ENCODINGS.build(name, num_heads=num_heads, max_len=max_len, **options)


__all__ = [
    "BucketedBias",
    "DecayBias",
    "RelativePositionBias",
    "Toeplitz2dBias",
    "ToeplitzBias",
    "available",
    "build",
    "get",
    "option_names",
    "register_encoding",
    "t5_buckets",
]
