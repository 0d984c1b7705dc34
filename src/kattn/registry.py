"""The registries of attention mechanisms, feature maps and relative positional encodings,
the mechanism spec and ``build``.

A registered mechanism name is a *preset*: an :class:`~kattn.Attention` class plus a dict of
default options. ``build(name, head_dim=..., num_heads=..., max_len=..., **options)`` merges the
user's options over the preset's and constructs the module.
"""

from __future__ import annotations

import colorsys
import functools
import hashlib
import importlib
import inspect
import numbers
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .attention.base import Attention
    from .features.base import FeatureMap
    from .positional.base import RelativePositionBias

T = TypeVar("T")

CAPABILITY_FLAGS = (
    "supports_causal",
    "supports_padding_mask",
    "supports_cross",
    "supports_recurrent",
    "is_exact",
)


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registration: a class, the preset options a name fixes, where it was registered
    and what else the registry kind records about it (``info``)."""

    name: str
    cls: type[T]
    defaults: Mapping[str, Any]
    module: str
    info: Any = None


def caller_module(depth: int = 2) -> str:
    """The ``__name__`` of the module ``depth`` frames up (1: the function calling this one;
    2, the default: that function's caller), so that registrations know their module."""
    return str(sys._getframe(depth).f_globals.get("__name__", "?"))


class Registry(Generic[T]):
    """Registered classes by name: the one registry of mechanisms, feature maps and relative
    positional encodings.

    ``register`` refuses a duplicate name; ``build(name, **kwargs)`` passes the size arguments
    (``build_args``) through, merges the caller's options over the name's preset, refuses an
    unknown option with a ``TypeError`` listing the valid ones (a class may compute its valid
    options with a classmethod ``option_names(options)``, as ``Attention`` does) and a bool or
    number option of another type with a ``TypeError`` naming it.

    Args:
        kind: what is registered, for messages ("mechanism", "feature map", ...).
        build_args: the constructor's size arguments, not options (e.g. head_dim, num_heads).
        where: how an option error names the build, formatted with ``name``.
    """

    def __init__(self, kind: str, *, build_args: tuple[str, ...] = (), where: str = "") -> None:
        self.kind = kind
        self.build_args = build_args
        self._where = where or kind + " {name!r}"
        self._items: dict[str, Entry[T]] = {}

    def register(
        self,
        name: str,
        cls: type[T],
        defaults: Mapping[str, Any] | None = None,
        *,
        info: Any = None,
        module: str | None = None,
    ) -> Entry[T]:
        """Register ``cls`` with preset ``defaults`` as ``name`` (``module``: the registering
        module, by default the caller's)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        entry = Entry(name, cls, dict(defaults or {}), module or caller_module(), info)
        self._items[name] = entry
        return entry

    def get(self, name: str) -> Entry[T]:
        """The entry of ``name`` (``ValueError`` listing the registered names otherwise)."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered ones are: {', '.join(self.available())}"
            ) from None

    def available(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def registered_in(self, module: str) -> list[str]:
        """The names registered by module ``module``."""
        return [n for n, e in sorted(self._items.items()) if e.module == module]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def option_names(self, name: str, options: Mapping[str, Any] | None = None) -> list[str] | None:
        """The options ``name`` accepts given the merged ``options`` (None: the class checks
        its options itself)."""
        entry = self.get(name)
        merged = {**entry.defaults, **(options or {})}
        own = getattr(entry.cls, "option_names", None)
        if callable(own):
            return own(merged)
        fixed = getattr(entry.cls, "fixed_options", ())
        return keyword_parameters(entry.cls.__init__, exclude=(*self.build_args, *fixed))

    def option_types(self, name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The declared type of each option of ``name`` given the merged ``options``."""
        entry = self.get(name)
        merged = {**entry.defaults, **(options or {})}
        own = getattr(entry.cls, "option_types", None)
        if callable(own):
            return own(merged)
        return declared_types(entry.cls.__init__, exclude=self.build_args)

    def build(self, name: str, /, **kwargs: Any) -> T:
        """Construct ``name`` from its size arguments and options (see the class docstring)."""
        entry = self.get(name)
        sizes = {arg: kwargs.pop(arg) for arg in self.build_args if arg in kwargs}
        merged = {**entry.defaults, **kwargs}
        where = self._where.format(name=name)
        valid = self.option_names(name, merged)
        if valid is not None:
            check_options(where, kwargs, valid)
        check_option_types(where, merged, self.option_types(name, merged))
        return entry.cls(**sizes, **merged)


def import_modules(package: str, paths: Iterable[str]) -> list[str]:
    """Import every module of ``package`` (its ``__path__``: ``paths``), so that each module's
    registrations run without a list of imports to keep up to date; returns their names."""
    names = sorted(m.name for m in pkgutil.iter_modules(list(paths)) if not m.ispkg)
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


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
    """What a registered mechanism is and can do (the flags of its default options).

    ``approximates``: the exact attention its default form estimates, or for a mechanism that
    is exact over a restricted pattern (local windows, block-sparse patterns), the full
    attention it stands in for (a name of ``kattn.bench.mechanism_error.EXACT_REFERENCES``);
    None where it is that attention itself or estimates none; ``size_option``: the option that
    sets its size (features, landmarks, projection), None if it has none; ``colour``: its
    colour in plots."""

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
    approximates: str | None = None
    size_option: str | None = None
    colour: str = ""


@dataclass(frozen=True)
class MechanismInfo:
    """What a mechanism's registration records besides its class and preset options."""

    summary: str
    reference: str
    complexity: str
    approximates: str | None = None
    size_option: str | None = None
    colour: str | None = None


MECHANISMS: Registry[Attention] = Registry(
    "mechanism", build_args=("head_dim", "num_heads", "max_len"), where="kattn.build({name!r})"
)
FEATURE_MAPS: Registry[FeatureMap] = Registry("feature map", build_args=("head_dim", "num_heads"))
ENCODINGS: Registry[RelativePositionBias] = Registry(
    "relative positional encoding", build_args=("num_heads", "max_len")
)


def register_mechanism(
    name: str,
    cls: type[Attention],
    *,
    summary: str,
    reference: str,
    complexity: str,
    defaults: Mapping[str, Any] | None = None,
    approximates: str | None = None,
    size_option: str | None = None,
    colour: str | None = None,
) -> None:
    """Register ``cls`` with preset ``defaults`` as mechanism ``name`` (raises on a duplicate
    name). Everything the library and its tools know about a mechanism is given here.

    Args:
        summary: one line for ``kattn list`` and the README's table.
        reference: the paper (authors, title, venue year).
        complexity: time and memory in the shape legend (L, M, D, Dv, ...).
        defaults: the preset options the name fixes.
        approximates: the exact attention the default form estimates (a name of
            ``kattn.bench.mechanism_error.EXACT_REFERENCES``, e.g. ``"softmax"``), or the
            full attention that a mechanism exact over a restricted pattern (a ``pattern()``
            method) stands in for; None if the mechanism is that attention itself or
            estimates none.
        size_option: the option setting its size (``num_features``, ``num_landmarks``, ...),
            which ``kattn bench speed --features`` sets.
        colour: its colour in plots (default: :func:`derived_colour` of the name).
    """
    info = MechanismInfo(
        summary.strip(), reference.strip(), complexity, approximates, size_option, colour
    )
    MECHANISMS.register(name, cls, defaults, info=info, module=caller_module())


def register_encoding(
    name: str, cls: type[RelativePositionBias], defaults: Mapping[str, Any] | None = None
) -> None:
    """Register ``cls`` (with preset ``defaults``) as ``kernelized(rpe=name)``."""
    ENCODINGS.register(name, cls, defaults, module=caller_module())


def available() -> list[str]:
    """Registered mechanism names, sorted."""
    return MECHANISMS.available()


def derived_colour(name: str) -> str:
    """A stable colour for ``name``: a hue from a hash of the name at a fixed, mid lightness
    and saturation (readable on white), so that names without a registered colour differ
    from each other and, almost surely, from the registered ones."""
    hue = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") / 2**32
    red, green, blue = colorsys.hls_to_rgb(hue, 0.45, 0.7)
    return "#" + "".join(f"{round(255 * c):02x}" for c in (red, green, blue))


def spec(name: str) -> MechanismSpec:
    """The :class:`MechanismSpec` of mechanism ``name`` with its default options."""
    entry = MECHANISMS.get(name)
    info: MechanismInfo = entry.info
    flags = entry.cls.capabilities(**entry.defaults)
    return MechanismSpec(
        name=name,
        summary=info.summary,
        reference=info.reference,
        complexity=info.complexity,
        defaults=dict(entry.defaults),
        approximates=info.approximates,
        size_option=info.size_option,
        colour=info.colour or derived_colour(name),
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
    return MECHANISMS.build(
        name, head_dim=head_dim, num_heads=num_heads, max_len=max_len, **options
    )
