"""Relative positional encodings for kernelized attention (``kernelized(rpe=...)``).

``available()`` lists them; ``build(name, num_heads=..., max_len=..., **options)`` makes one,
which can be passed as ``rpe=`` to several attention modules to share it across layers.
"""

from __future__ import annotations

from typing import Any

from ..registry import (
    Registry,
    check_option_types,
    check_options,
    declared_types,
    keyword_parameters,
)
from .base import RelativePositionBias
from .bucketed import BucketedBias, t5_buckets
from .decay import DecayBias
from .toeplitz import Toeplitz2dBias, ToeplitzBias

ENCODINGS: Registry[type[RelativePositionBias]] = Registry("relative positional encoding")
ENCODINGS.add("toeplitz", ToeplitzBias)
ENCODINGS.add("bucketed", BucketedBias)
ENCODINGS.add("decay", DecayBias)
ENCODINGS.add("toeplitz2d", Toeplitz2dBias)


def available() -> list[str]:
    """Registered encoding names, sorted."""
    return ENCODINGS.names()


def get(name: str) -> type[RelativePositionBias]:
    """The class registered as ``name`` (``ValueError`` naming the valid ones otherwise)."""
    return ENCODINGS.get(name)


def option_names(name: str) -> list[str]:
    """The options encoding ``name`` accepts (besides ``num_heads`` and ``max_len``)."""
    return keyword_parameters(get(name).__init__, exclude=("num_heads", "max_len"))


def build(
    name: str, *, num_heads: int, max_len: int | None = None, **options: Any
) -> RelativePositionBias:
    """Build encoding ``name`` with per-head parameters; unknown options, and bool or number
    options of another type, raise ``TypeError``."""
    cls = get(name)
    where = f"relative positional encoding {name!r}"
    check_options(where, options, option_names(name))
    check_option_types(where, options, declared_types(cls.__init__))
    return cls(num_heads=num_heads, max_len=max_len, **options)


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
    "t5_buckets",
]
