"""``convert_attention``: swap the mechanism inside a model's ``kattn.MultiheadAttention``
modules for another, keeping every learnt quantity the two share.

Luo et al. 2021, §4.5 train Transformers with softmax attention, standard or over normalised
queries and keys, with or without a relative positional encoding, and then replace each
softmax by PRF kernelized attention keeping every weight, without fine-tuning: normalised
attention converts with a small loss, standard attention with a large one. Here that is
``convert_attention(model, "nprf_rpe", num_features=...)`` on a model trained with
``normalized_softmax`` (``rpe="toeplitz"``): the projections stay where they are (in
``MultiheadAttention``), the relative bias ``rpe.*`` and the temperature ``log_temperature``
move into the new mechanism.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import Attention
from ..attention.kernelized import KernelizedAttention
from ..attention.softmax import SoftmaxAttention
from ..attention.softmax_rpe import RelativeSoftmaxAttention
from ..checks import boolean
from ..registry import MECHANISMS, build
from .multihead import MultiheadAttention, pass_attention_dropout


@dataclass(frozen=True)
class ModuleConversion:
    """What happened to one ``MultiheadAttention``'s mechanism.

    Attributes:
        name: the module's qualified name in the model ("" for the model itself).
        source, target: the mechanism names before and after.
        kept: state-dict entries of the old mechanism copied into the new one (same name and
            shape), e.g. ``rpe.bias``, ``log_temperature``.
        initialised: entries of the new mechanism that nothing was copied into (its own
            initialisation or random draw).
        dropped: entries of the old mechanism with no place in the new one.
    """

    name: str
    source: str
    target: str
    kept: tuple[str, ...]
    initialised: tuple[str, ...]
    dropped: tuple[str, ...]

    def __str__(self) -> str:
        def names(entries: tuple[str, ...]) -> str:
            return ", ".join(entries) if entries else "-"

        return (
            f"{self.name or '(model)'}: {self.source} -> {self.target}; kept: "
            f"{names(self.kept)}; initialised: {names(self.initialised)}; dropped: "
            f"{names(self.dropped)}"
        )


@dataclass(frozen=True)
class ConversionReport:
    """The conversions :func:`convert_attention` made, one per module, in model order."""

    modules: tuple[ModuleConversion, ...]

    def __iter__(self) -> Iterator[ModuleConversion]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def __getitem__(self, name: str) -> ModuleConversion:
        """The conversion of the module with qualified name ``name``."""
        for module in self.modules:
            if module.name == name:
                return module
        raise KeyError(f"no converted module named {name!r}")

    def __str__(self) -> str:
        return "\n".join(str(m) for m in self.modules)


def convert_attention(
    model: nn.Module,
    to: str,
    *,
    only: str | Callable[[str, MultiheadAttention], bool] | None = None,
    strict: bool = True,
    **options: Any,
) -> ConversionReport:
    """Replace the mechanism inside every :class:`MultiheadAttention` of ``model`` by
    ``kattn.build(to, head_dim=..., num_heads=..., max_len=..., **options)`` (sizes of the old
    one), copying each state-dict entry of the old mechanism whose name and shape exist in
    the new one.

    The projections live in ``MultiheadAttention`` and are never touched; the new mechanism
    takes the old one's device, dtype and training mode, and a ``MultiheadAttention``
    ``dropout`` as ``MultiheadAttention`` itself passes it. A positional encoding shared by
    several converted modules (``TransformerEncoder``'s ``share_rpe``) stays shared. Every
    module is checked before any is changed.

    Args:
        model: changed in place (it may itself be a ``MultiheadAttention``).
        to: a name from ``kattn.available()``.
        only: convert only the modules whose qualified name matches this ``fnmatch`` pattern
            (``"layers.0.*"``), or for which this callable of ``(name, module)`` is True.
        strict: refuse (``ValueError``, nothing changed) conversions that change the function
            in an obvious way: q/k normalisation on one side only; a positional encoding, a
            temperature or any other learnt parameter of the old mechanism with no place in
            the new one; a different logit scale between mechanisms whose weights are
            ``exp(scale · q·k)`` (softmax, ``softmax_rpe``/``normalized_softmax``, kernelized
            attention with a softmax-estimating feature map). ``False`` converts anyway; the
            report says what was dropped.
        **options: options of ``to``.

    Returns:
        The :class:`ConversionReport`: per module, what was kept, initialised and dropped.

    Raises:
        ValueError: no module to convert, an unknown ``to``, or a refused conversion.
    """
    boolean("strict", strict)
    MECHANISMS.get(to)  # ValueError naming the registered ones
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, MultiheadAttention) and _selected(only, name, module)
    ]
    if not targets:
        raise ValueError(
            "convert_attention: the model has no kattn.MultiheadAttention"
            + ("" if only is None else " matching only=")
            + " to convert (kattn.patch swaps torch.nn.MultiheadAttention for one)"
        )
    planned = []
    for name, mha in targets:
        new = _build_like(mha, to, options)
        report = _transfer(mha.attention, new, name, mha.mechanism, to)
        if strict:
            _refuse_obvious_changes(mha.attention, new, report)
        planned.append((mha, new, report))
    shared: dict[int, nn.Module] = {}
    for mha, new, _ in planned:
        _keep_encoding_shared(mha.attention, new, shared)
        mha.attention = new
        mha.mechanism = to
    return ConversionReport(tuple(report for _, _, report in planned))


def _selected(
    only: str | Callable[[str, MultiheadAttention], bool] | None,
    name: str,
    module: MultiheadAttention,
) -> bool:
    if only is None:
        return True
    if isinstance(only, str):
        return fnmatch.fnmatchcase(name, only)
    if callable(only):
        return bool(only(name, module))
    raise TypeError(f"only must be a name pattern (str), a callable or None, got {only!r}")


def _build_like(mha: MultiheadAttention, to: str, options: dict[str, Any]) -> Attention:
    """``to`` with the sizes of ``mha``'s mechanism, on its device and in its dtype."""
    old = mha.attention
    options = dict(options)
    pass_attention_dropout(options, to, mha.dropout, what="the MultiheadAttention's dropout")
    new = build(to, head_dim=old.head_dim, num_heads=old.num_heads, max_len=old.max_len, **options)
    reference = _first_floating(old)
    if reference is None:  # a mechanism without tensors: the projections' device and dtype
        reference = _first_floating(mha)
    if reference is not None:
        new = new.to(device=reference.device, dtype=reference.dtype)
    return new.train(old.training)


def _first_floating(module: nn.Module) -> Tensor | None:
    tensors = [*module.parameters(), *module.buffers()]
    return next((t for t in tensors if t.is_floating_point()), None)


def _transfer(
    old: Attention, new: Attention, name: str, source: str, target: str
) -> ModuleConversion:
    """Copy the entries ``old`` and ``new`` share into ``new``; the module's report."""
    before, after = old.state_dict(), new.state_dict()
    kept = {
        key: value
        for key, value in before.items()
        if key in after and _same_kind(value, after[key])
    }
    new.load_state_dict({**after, **kept}, strict=True)
    report = ModuleConversion(
        name=name,
        source=source,
        target=target,
        kept=tuple(kept),
        initialised=tuple(k for k in after if k not in kept),
        dropped=tuple(k for k in before if k not in kept),
    )
    return report


def _same_kind(a: Any, b: Any) -> bool:
    """Whether state-dict value ``a`` can take the place of ``b``: tensors of one shape, or
    two non-tensor extra states."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
    return True


def _refuse_obvious_changes(old: Attention, new: Attention, report: ModuleConversion) -> None:
    """``ValueError`` (see ``strict`` of :func:`convert_attention`)."""
    where = f"convert_attention: {report.name or '(model)'} ({report.source} -> {report.target})"
    advice = "; pass strict=False to convert anyway"
    old_norm, new_norm = (bool(getattr(a, "normalize_qk", False)) for a in (old, new))
    if old_norm != new_norm:
        raise ValueError(
            f"{where}: the old mechanism {'normalises' if old_norm else 'does not normalise'} "
            f"q and k and the new one {'does' if new_norm else 'does not'}: pass "
            f"normalize_qk={old_norm} if {report.target!r} takes it{advice}"
        )
    if getattr(old, "rpe", None) is not None and getattr(new, "rpe", None) is None:
        raise ValueError(
            f"{where}: the old mechanism has a relative positional encoding and the new one "
            f"none: pass rpe= (e.g. rpe='toeplitz') with the same encoding options{advice}"
        )
    learnt = {n for n, _ in old.named_parameters()}
    lost = [k for k in report.dropped if k in learnt or k.endswith("log_temperature")]
    if lost:
        raise ValueError(
            f"{where}: learnt entries of the old mechanism have no place of the same name and "
            f"shape in the new one: {', '.join(lost)} (build it with the same encoding "
            f"options, and learn_temperature=True or the same temperature){advice}"
        )
    old_scale, new_scale = _logit_scale(old), _logit_scale(new)
    if (
        old_scale is not None
        and new_scale is not None
        and not torch.allclose(old_scale, new_scale, rtol=1e-6, atol=0.0)
    ):
        raise ValueError(
            f"{where}: the weights are exp(scale · q·k) on both sides but the scales per "
            f"head differ ({_values(old_scale)} before, {_values(new_scale)} after): pass "
            f"scale= (and temperature=) to match{advice}"
        )


def _logit_scale(attn: Attention) -> Tensor | None:
    """``(H,)``: the factor of ``q·k`` (``q̂·k̂`` with ``normalize_qk``) inside ``exp`` per
    head, temperature included, for mechanisms whose weights are ``exp`` of it; else None."""
    if isinstance(attn, SoftmaxAttention):
        scale = attn.scale if attn.scale is not None else attn.head_dim**-0.5
    elif isinstance(attn, RelativeSoftmaxAttention | KernelizedAttention):
        if isinstance(attn, KernelizedAttention) and not attn.feature_map.approximates_softmax:
            return None  # elu, relu, ...: the scale means something else
        scale = attn.scale
    else:
        return None
    log_t = getattr(attn, "log_temperature", None)
    tau = torch.ones(attn.num_heads) if log_t is None else torch.exp(log_t.detach().cpu())
    return scale * tau.double()


def _values(x: Tensor) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in x.tolist()) + ")"


def _keep_encoding_shared(old: Attention, new: Attention, shared: dict[int, nn.Module]) -> None:
    """Where several old mechanisms held one encoding module, let the new ones hold one too
    (the first new one's, which already has the copied values)."""
    old_rpe, new_rpe = getattr(old, "rpe", None), getattr(new, "rpe", None)
    if old_rpe is None or new_rpe is None:
        return
    first = shared.setdefault(id(old_rpe), new_rpe)
    if first is not new_rpe and _layout(first) == _layout(new_rpe):
        new.rpe = first


def _layout(module: nn.Module) -> tuple[type, dict[str, Any]]:
    """A module's class and the shapes of its state-dict tensors."""
    shapes = {k: getattr(v, "shape", None) for k, v in module.state_dict().items()}
    return type(module), shapes
