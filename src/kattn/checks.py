"""Argument checks shared by every module: positive ints, positive reals, bools.

Each returns the value it checked (so ``self.n = positive_int("n", n)`` reads in one line) and
raises an error that names the argument and shows the value it got.
"""

from __future__ import annotations

import math
import numbers


def is_positive_int(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a positive int (not a bool), else ``ValueError``."""
    if not is_positive_int(value):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value  # type: ignore[return-value]


def int_at_least(name: str, value: object, least: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``least``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def positive_int_or_none(name: str, value: object) -> int | None:
    """``value`` if it is None or a positive int (not a bool), else ``ValueError``."""
    if value is not None and not is_positive_int(value):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return value  # type: ignore[return-value]


def is_positive_real(value: object) -> bool:
    """Whether ``value`` is a finite real number (not a bool) above 0 (NaN and inf are not)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and 0 < float(value) < math.inf
    )


def _finite_hint(value: object) -> str:
    """What to add to a refusal of an infinite number (positive, but not finite)."""
    infinite = isinstance(value, numbers.Real) and math.isinf(float(value))
    return " (it must be finite)" if infinite else ""


def positive_float(name: str, value: object) -> float:
    """``value`` as a float if it is a finite real number > 0 (not a bool), else
    ``ValueError``."""
    if not is_positive_real(value):
        raise ValueError(f"{name} must be positive, got {value!r}{_finite_hint(value)}")
    return float(value)  # type: ignore[arg-type]


def positive_float_or_none(name: str, value: object) -> float | None:
    """``value`` as a float if it is None or a finite real number > 0, else ``ValueError``."""
    if value is not None and not is_positive_real(value):
        raise ValueError(f"{name} must be positive or None, got {value!r}{_finite_hint(value)}")
    return None if value is None else float(value)  # type: ignore[arg-type]


def boolean(name: str, value: object) -> bool:
    """``value`` if it is True or False (not 0, 1 or a string), else ``ValueError`` naming the
    type it got. (Options given to ``kattn.build`` are type-checked before this, with a
    ``TypeError``, from the constructor's annotations.)"""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {type(value).__name__}")
    return value
