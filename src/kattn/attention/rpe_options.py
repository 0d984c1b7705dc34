"""The ``rpe=`` option shared by the mechanisms that take a relative positional encoding:
the encoding's own options as the mechanism takes them, their declared types, the aggregator
class (for capability flags) and the encoding module itself.

Kernelized attention multiplies each term by ``c_{j−i} = exp(b_{j−i})`` (Luo et al. 2021,
eq. 10); softmax attention with relative positions adds the same ``b_{j−i}`` to its logits,
so both hold the same module (and the same ``rpe.*`` state-dict entries).
"""

from __future__ import annotations

from typing import Any

from .. import positional
from ..aggregator import Aggregator, LinearAggregator
from ..registry import declared_types


def rpe_option_names(name: str) -> dict[str, str]:
    """Options of encoding ``name`` as ``kernelized`` takes them → the encoding's own names."""
    return {("rpe_method" if o == "method" else o): o for o in positional.option_names(name)}


def encoding_options(rpe: object, *, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """:func:`rpe_option_names` of ``rpe`` when it is a registered name (else none), without
    the mechanism-side names in ``exclude``."""
    if not (isinstance(rpe, str) and rpe in positional.available()):
        return {}
    return {ours: o for ours, o in rpe_option_names(rpe).items() if ours not in exclude}


def encoding_option_types(rpe: object, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The declared type of each of :func:`encoding_options`, by the mechanism-side name."""
    names = encoding_options(rpe, exclude=exclude)
    if not names:
        return {}
    declared = declared_types(positional.get(str(rpe)).__init__)
    return {ours: declared[o] for ours, o in names.items() if o in declared}


def aggregator_class(rpe: object) -> type[Aggregator]:
    """The aggregator class ``rpe`` gives: the encoding's class for a registered name or a
    module, else ``LinearAggregator`` (for None; anything else the constructor refuses)."""
    if isinstance(rpe, str) and rpe in positional.available():
        return positional.get(rpe)
    if isinstance(rpe, Aggregator):
        return type(rpe)
    return LinearAggregator


def build_aggregator(
    rpe: str | positional.RelativePositionBias | None,
    num_heads: int,
    max_len: int | None,
    options: dict[str, Any],
    *,
    exclude: tuple[str, ...] = (),
) -> Aggregator:
    """The plain aggregator without ``rpe``, else the encoding module (its options, all of
    :func:`encoding_options` but ``exclude``, are taken out of ``options``)."""
    if rpe is None:
        return LinearAggregator(num_heads=num_heads)
    if isinstance(rpe, positional.RelativePositionBias):
        configured = sorted(
            o for name in positional.available() for o in rpe_option_names(name) if o in options
        )
        if configured:
            raise TypeError(
                f"options {configured} configure a relative positional encoding, but rpe is "
                "a module already: pass them to kattn.positional.build instead"
            )
        if rpe.num_heads != num_heads:
            raise ValueError(
                f"rpe was built for {rpe.num_heads} heads, this attention has {num_heads}"
            )
        return rpe
    if not isinstance(rpe, str):
        raise TypeError(
            f"rpe must be None, a name from kattn.positional.available() or a "
            f"RelativePositionBias module, got {type(rpe).__name__}"
        )
    names = encoding_options(rpe, exclude=exclude)
    own = {names[o]: options.pop(o) for o in list(options) if o in names}
    return positional.build(rpe, num_heads=num_heads, max_len=max_len, **own)
