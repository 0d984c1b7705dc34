"""``kattn.patch`` for x-transformers models: a kattn mechanism in place of each ``Attend``.

An x-transformers ``Attention`` projects queries, keys and values, normalises them, applies
rotary or polar position embeddings, and hands the heads to its ``attend`` module (an
``Attend``), which computes ``softmax(q kᵀ · scale) v`` with the masks. Patching replaces
only that ``attend`` by :class:`XTransformersAttend` around a kattn mechanism: every
projection, norm and gate keeps its weights and its place, and whatever happens to q and k
before the core (rotary embeddings included) still happens. What a kattn mechanism cannot
honour (a bias added to the logits, talking heads, memory key/values, another normaliser
than softmax, ...) is refused by :func:`xtransformers_refusals` before anything changes.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.base import Attention
from ..registry import build
from .multihead import pass_attention_dropout

_MODULE = "x_transformers.x_transformers"


@dataclass(frozen=True)
class XTarget:
    """One x-transformers ``Attention`` found in a model.

    Attributes:
        name: its qualified name in the model.
        module: the ``Attention`` itself.
        causal: whether it attends causally (its own flag or that of its layers).
        cross: whether it attends to another sequence (a ``'c'`` layer, or a context width
            other than the input's).
        layers: the ``AttentionLayers`` holding it (None for a free-standing one).
        max_len: the longest sequence its wrapper takes (memory tokens included), if known.
    """

    name: str
    module: Any  # x-transformers' classes, which carry no annotations
    causal: bool
    cross: bool
    layers: Any
    max_len: int | None


class XTransformersAttend(nn.Module):
    """A kattn mechanism called like x-transformers' ``Attend``: ``(q, k, v, mask=...)``.

    q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)`` with H a multiple of
    Hkv (grouped queries: the key/value heads are tiled as x-transformers tiles them);
    ``mask`` is x-transformers' key mask, True for a key to keep, ``(B, Lk)`` or
    ``(B, 1, 1, Lk)``. Returns ``(out, Intermediates())`` with out ``(B, H, Lq, Dv)``; the
    intermediates hold no attention matrix, since the mechanism never forms one.

    Args:
        attention: the kattn mechanism, built for H heads of size D.
        causal: the default when the call does not say.
        scale: x-transformers' logit scale; another one than ``1/√D`` is applied to the
            queries before the mechanism (which scales by ``1/√D`` itself).
        dropout: the attention dropout of the ``Attend`` replaced (kept so that patching
            again with another mechanism sees it).
    """

    def __init__(
        self, attention: Attention, *, causal: bool, scale: float, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.attention = attention
        self.causal = causal
        self.query_scale = scale * math.sqrt(attention.head_dim)
        self.dropout = dropout

    @property
    def scale(self) -> float:
        """x-transformers' logit scale this core reproduces."""
        return self.query_scale / math.sqrt(self.attention.head_dim)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        attn_bias: Tensor | None = None,
        prev_attn: Tensor | None = None,
        attn_delta: Tensor | None = None,
        row_mask: Tensor | None = None,
        flash_pack_seq_kwargs: Any = None,
        causal: bool | None = None,
    ) -> tuple[Tensor, Any]:
        """Attend with the kattn mechanism; see the class docstring for shapes."""
        _refuse_call_arguments(
            attn_bias=attn_bias,
            prev_attn=prev_attn,
            attn_delta=attn_delta,
            flash_pack_seq_kwargs=flash_pack_seq_kwargs,
        )
        causal = self.causal if causal is None else causal
        lq, lk = q.shape[-2], k.shape[-2]
        if causal and lq != lk:
            raise NotImplementedError(
                f"causal attention of {lq} queries over {lk} keys (cached keys, memories or "
                "extra key/values): the kattn mechanism attends causally only when queries and "
                "keys are the same positions; generate without the key/value cache "
                "(cache_kv=False) and without mems"
            )
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # x-transformers tiles them 'b kvh n d -> b (r kvh) n d'
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        if not math.isclose(self.query_scale, 1.0, rel_tol=1e-12):
            q = q * self.query_scale
        padding = _key_padding(mask, batch=q.shape[0], keys=lk)
        out = self.attention(q, k, v, causal=causal, key_padding_mask=padding)
        return out, sys.modules["x_transformers.attend"].Intermediates()

    def extra_repr(self) -> str:
        return f"causal={self.causal}, query_scale={self.query_scale:g}"


def _refuse_call_arguments(**arguments: Any) -> None:
    """``NotImplementedError`` for a call argument a kattn mechanism has no place for."""
    why = {
        "attn_bias": "a bias added to the attention logits (ALiBi, relative position bias)",
        "prev_attn": "the previous layer's attention logits (residual attention)",
        "attn_delta": "a change to the attention matrix",
        "flash_pack_seq_kwargs": "flash attention's packed sequences",
    }
    for name, value in arguments.items():
        if value is not None:
            raise NotImplementedError(
                f"{name}: the kattn mechanism cannot take {why[name]}; it never forms the "
                "attention matrix"
            )


def _key_padding(mask: Tensor | None, *, batch: int, keys: int) -> Tensor | None:
    """kattn's ``(B, Lk)`` padding (True = ignored) from x-transformers' key mask (True = kept)."""
    if mask is None:
        return None
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0]
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise NotImplementedError(
            f"mask of shape {tuple(mask.shape)}: the kattn mechanism takes key padding only "
            "(x-transformers' mask / context_mask, (B, Lk)); an attention mask over query-key "
            "pairs (attn_mask, max_attend_past) cannot be applied without forming the matrix"
        )
    return ~mask.expand(batch, keys)


def is_xtransformers_attention(module: nn.Module) -> bool:
    """Whether ``module`` is an x-transformers ``Attention`` (without importing the library)."""
    library = sys.modules.get(_MODULE)
    return library is not None and isinstance(module, library.Attention)


def find_xtransformers(model: nn.Module) -> list[XTarget]:
    """Every x-transformers ``Attention`` in ``model`` (each once), with its context."""
    if sys.modules.get(_MODULE) is None:
        return []
    context = dict(_layer_context(model))
    max_lens = dict(_wrapper_lengths(model))
    targets: list[XTarget] = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        if not is_xtransformers_attention(module) or id(module) in seen:
            continue
        seen.add(id(module))
        layer_type, layers = context.get(id(module), (None, None))
        in_width, context_width = module.to_q.in_features, module.to_k.in_features
        cross = layer_type == "c" or (layer_type is None and in_width != context_width)
        causal = bool(module.causal) or (
            layer_type == "a" and bool(getattr(layers, "causal", False))
        )
        targets.append(XTarget(name, module, causal, cross, layers, max_lens.get(id(module))))
    return targets


def _layer_context(model: nn.Module) -> Iterator[tuple[int, tuple[str, nn.Module]]]:
    """(id of an Attention, (its layer type 'a' or 'c', its AttentionLayers))."""
    for layers in model.modules():
        types = getattr(layers, "layer_types", None)
        blocks = getattr(layers, "layers", None)
        if types is None or not isinstance(blocks, nn.ModuleList):
            continue
        for layer_type, entry in zip(types, blocks, strict=False):
            if isinstance(entry, nn.ModuleList) and len(entry) > 1:
                yield id(entry[1]), (layer_type, layers)


def _wrapper_lengths(model: nn.Module) -> Iterator[tuple[int, int]]:
    """(id of an Attention, the longest sequence its wrapper takes, memory tokens included)."""
    for wrapper in model.modules():
        length = getattr(wrapper, "max_seq_len", None)
        if isinstance(length, int) and length > 0 and hasattr(wrapper, "attn_layers"):
            length += int(getattr(wrapper, "num_memory_tokens", 0) or 0)
            for module in wrapper.modules():
                yield id(module), length


def xtransformers_refusals(target: XTarget, mechanism: str, attention: Attention) -> list[str]:
    """Sentences saying what of ``target`` the kattn ``attention`` (built as ``mechanism``)
    cannot honour (none: fine)."""
    module, attend = target.module, target.module.attend
    reasons = [why for flag, why in _ATTEND_FEATURES if _enabled(attend, flag)]
    # an earlier patch's core stands for a softmax Attend already accepted
    if not isinstance(attend, XTransformersAttend) and not _is_softmax(attend):
        reasons.append(
            "its attention weights are not a softmax of the logits (sigmoid, hard, top-k, "
            "Gumbel or a custom function): a kattn mechanism approximates softmax attention"
        )
    reasons += [why for flag, why in _ATTENTION_FEATURES if _enabled(module, flag)]
    layers = target.layers
    if layers is not None and not target.cross and getattr(layers, "rel_pos", None) is not None:
        kind = type(layers.rel_pos).__name__
        reasons.append(
            f"its layers add a position bias to the logits ({kind}, e.g. ALiBi or T5's "
            "relative bias), which a kattn mechanism has no place for; rotary embeddings "
            "(rotary_pos_emb=True) are applied to q and k before the core and work"
        )
    residual = "cross_residual_attn" if target.cross else "residual_attn"
    if layers is not None and getattr(layers, residual, False):
        reasons.append(
            f"its layers pass attention logits from layer to layer ({residual}=True), which "
            "a kattn mechanism never forms"
        )
    if target.causal and not attention.supports_causal:
        reasons.append(f"it is causal and mechanism {mechanism!r} has no causal form")
    if target.cross and not attention.supports_cross:
        reasons.append(
            f"it is cross-attention and mechanism {mechanism!r} does not support "
            "cross-attention (supports_cross is False)"
        )
    return reasons


# (attribute, why it cannot be honoured): a truthy attribute means the feature is on
_ATTEND_FEATURES = (
    ("pre_softmax_talking_heads", "talking heads mix the heads' attention matrices"),
    ("post_softmax_talking_heads", "talking heads mix the heads' attention matrices"),
    ("pre_scale_post_talking_heads", "talking heads mix the heads' attention matrices"),
    ("l2_distance", "its logits are negative squared distances, not dot products"),
    ("selective", "selective attention edits the attention matrix"),
    ("cog_signed", "cog attention gives signed attention weights"),
    ("add_zero_kv", "it attends to an extra all-zero key/value (add_zero_kv)"),
    ("head_learned_sink", "a learned attention sink joins the softmax"),
    ("softclamp_logits", "it soft-clamps the logits"),
    ("cope", "contextual position encoding (CoPE) adds to the logits"),
    ("inverted_attention", "inverted attention normalises over queries"),
    ("flash_pack_seq", "flash attention's packed sequences are flash-only"),
)
_ATTENTION_FEATURES = (
    ("num_mem_kv", "it prepends learned memory key/values (num_mem_kv)"),
    ("data_dependent_alibi", "a data-dependent ALiBi bias adds to the logits"),
    ("rel_proj_pos_bias", "a relative projection position bias adds to the logits"),
    ("max_attend_past", "max_attend_past masks query-key pairs beyond a distance"),
)


def _enabled(module: nn.Module, flag: str) -> bool:
    value = getattr(module, flag, None)
    return value is not None and value is not False and not (isinstance(value, int) and value == 0)


def _is_softmax(attend: nn.Module) -> bool:
    """Whether ``attend`` normalises its logits by softmax over the keys."""
    fn = getattr(attend, "attn_fn", None)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn is F.softmax


def xtransformers_core(target: XTarget, mechanism: str, options: dict[str, Any]) -> Attention:
    """The kattn mechanism for ``target``: its heads and head size, options, dropout."""
    module, attend = target.module, target.module.attend
    options = dict(options)
    max_len = options.pop("max_len", target.max_len)
    dropout = float(getattr(attend, "dropout", 0.0) or 0.0)
    pass_attention_dropout(options, mechanism, dropout, where=f"{target.name}: ")
    heads = module.heads
    weight = module.to_q.weight
    core = build(
        mechanism,
        head_dim=module.to_q.out_features // heads,
        num_heads=heads,
        max_len=max_len,
        **options,
    )
    return core.to(device=weight.device, dtype=weight.dtype).train(attend.training)


def install(target: XTarget, core: Attention) -> XTransformersAttend:
    """Put ``core`` in ``target``'s place of ``attend``; the key/value cache is turned off."""
    module = target.module
    head_dim = core.head_dim
    scale = getattr(module.attend, "scale", None) or head_dim**-0.5
    dropout = float(getattr(module.attend, "dropout", 0.0) or 0.0)
    new = XTransformersAttend(core, causal=bool(module.causal), scale=scale, dropout=dropout)
    module.attend = new
    # x-transformers decodes one token against cached keys by calling the core with Lq = 1
    # and causal=False, which assumes the query sits after every key: true for softmax, not
    # for mechanisms with positions or windows. Without the cache, each step recomputes the
    # causal forward over the whole prefix, which every causal mechanism gets right.
    module.can_cache_kv = False
    return new


def turn_off_kv_cache(model: nn.Module) -> None:
    """``can_cache_kv = False`` on every x-transformers container holding a patched core."""
    containers: list[Any] = list(model.modules())
    for container in containers:
        if "can_cache_kv" in vars(container) and any(
            isinstance(m, XTransformersAttend) for m in container.modules()
        ):
            container.can_cache_kv = False
