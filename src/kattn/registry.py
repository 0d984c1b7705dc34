"""Registries of attention mechanisms and feature maps, the mechanism spec and ``build``.

A registered mechanism name is a *preset*: an :class:`~kattn.Attention` class plus a dict of
default options. ``build(name, head_dim=..., num_heads=..., max_len=..., **options)`` merges the
user's options over the preset's and constructs the module.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .attention.base import Attention

T = TypeVar("T")

CAPABILITY_FLAGS = (
    "supports_causal",
    "supports_padding_mask",
    "supports_cross",
    "supports_recurrent",
    "is_exact",
)


class Registry(Generic[T]):
    """A name → item mapping that refuses duplicate names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered ones are: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


def check_options(where: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Raise ``TypeError`` naming every option in ``given`` that is not in ``valid``."""
    valid = sorted(set(valid))
    unknown = sorted(set(given) - set(valid))
    if unknown:
        names = ", ".join(repr(u) for u in unknown)
        raise TypeError(
            f"{where}: unknown option(s) {names}; valid options are: "
            f"{', '.join(valid) if valid else '(none)'}"
        )


def keyword_parameters(fn: Callable[..., Any], exclude: Iterable[str] = ()) -> list[str]:
    """Names of the keyword-capable parameters of ``fn`` (``self`` and ``exclude`` left out)."""
    skip = {"self", *exclude}
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip
    ]


def declared_types(fn: Callable[..., Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The annotated type of each keyword-capable parameter of ``fn`` (none if an annotation
    names something that cannot be resolved at run time)."""
    hints = _type_hints(fn)
    return {name: hints[name] for name in keyword_parameters(fn, exclude) if name in hints}


@functools.cache
def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError):
        return {}


def check_option_types(where: str, options: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` naming the first option whose value does not have its declared type.

    Only the types whose values no range check catches are checked here: a ``bool`` option
    takes True or False (not 1, not a string), a ``float`` option a real number (ints and
    NumPy reals too, not a bool or a string), each with ``None`` where declared optional.
    Sizes, names and ranges are the classes' own checks (``ValueError``)."""
    for name, value in options.items():
        if name not in declared:
            continue
        expected = _expected_type(declared[name], value)
        if expected is not None:
            raise TypeError(
                f"{where}: option {name!r} must be {expected}, "
                f"got {value!r} ({type(value).__name__})"
            )


def _expected_type(hint: Any, value: Any) -> str | None:
    """What ``value`` should have been for a ``bool``/``float`` hint, or None if it fits (or
    the hint is another type, left to the class)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = set(typing.get_args(hint)) if union else {hint}
    optional = type(None) in allowed
    allowed.discard(type(None))
    if optional and value is None:
        return None
    if allowed == {bool}:
        ok, expected = isinstance(value, bool), "a bool (True or False)"
    elif allowed == {float}:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        ok, expected = real, "a real number"
    else:
        return None
    return None if ok else expected + (" or None" if optional else "")


@dataclass(frozen=True)
class MechanismSpec:
    """What a registered mechanism is and can do (the flags of its default options)."""

    name: str
    summary: str
    reference: str
    complexity: str
    supports_causal: bool
    supports_padding_mask: bool
    supports_cross: bool
    supports_recurrent: bool
    is_exact: bool
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Mechanism:
    cls: type[Attention]
    defaults: Mapping[str, Any]
    summary: str
    reference: str
    complexity: str


MECHANISMS: Registry[_Mechanism] = Registry("mechanism")

_BUILD_ARGS = ("head_dim", "num_heads", "max_len")


def register_mechanism(
    name: str,
    cls: type[Attention],
    *,
    summary: str,
    reference: str,
    complexity: str,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Register ``cls`` with preset ``defaults`` under ``name`` (raises on a duplicate name)."""
    MECHANISMS.add(
        name,
        _Mechanism(cls, dict(defaults or {}), summary.strip(), reference.strip(), complexity),
    )


def available() -> list[str]:
    """Registered mechanism names, sorted."""
    return MECHANISMS.names()


def spec(name: str) -> MechanismSpec:
    """The :class:`MechanismSpec` of mechanism ``name`` with its default options."""
    entry = MECHANISMS.get(name)
    flags = entry.cls.capabilities(**entry.defaults)
    return MechanismSpec(
        name=name,
        summary=entry.summary,
        reference=entry.reference,
        complexity=entry.complexity,
        defaults=dict(entry.defaults),
        **{flag: bool(flags[flag]) for flag in CAPABILITY_FLAGS},
    )


def build(
    name: str, *, head_dim: int, num_heads: int, max_len: int | None = None, **options: Any
) -> Attention:
    """Build mechanism ``name`` for heads of size ``head_dim``.

    Args:
        name: a name from :func:`available`.
        head_dim: D, the size of each query/key head.
        num_heads: H; per-head parameters are sized by it and other head counts are refused.
        max_len: longest sequence the module will see (required only by mechanisms whose
            parameters depend on it).
        **options: the mechanism's options; everything has a default from its paper.

    Raises:
        ValueError: unknown name or bad sizes.
        TypeError: an unknown option (the message lists the valid ones), or a bool or number
            option given a value of another type.
    """
    entry = MECHANISMS.get(name)
    merged = {**entry.defaults, **options}
    valid = entry.cls.option_names(merged)
    if valid is not None:
        check_options(f"kattn.build({name!r})", options, valid)
    check_option_types(f"kattn.build({name!r})", merged, entry.cls.option_types(merged))
    return entry.cls(head_dim=head_dim, num_heads=num_heads, max_len=max_len, **merged)
