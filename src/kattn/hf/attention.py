"""The attention function of the ``kattn:<name>`` implementations of transformers.

transformers calls it as it calls ``sdpa_attention_forward``: ``(module, query (B, H, Lq, D),
key (B, Hkv, Lk, D), value (B, Hkv, Lk, Dv), attention_mask, dropout, scaling, **kwargs)`` and
expects ``(output (B, Lq, H, Dv), weights)``. It runs ``module.kattn``, the kattn module of
that layer (:mod:`kattn.hf.attach`), with causality from ``module.is_causal`` and the mask as
key padding (:mod:`kattn.hf.masks`); grouped key/value heads are repeated to the query heads.

With a cache there are two decoding paths. A :class:`~kattn.hf.cache.RecurrentLayer` hands
over only the new keys, which go through the mechanism's ``prefill``/``step``. Keys from a
key/value cache (mechanisms without a recurrent form) are more than the queries; the queries
are then placed at the end of a zero-filled block as long as the keys and the causal forward
is run, keeping its last rows: the output the full forward gives them, where query rows do
not depend on one another (:mod:`kattn.hf.rows`; other mechanisms are refused). A cached
cross-attention step is refused likewise where its query's rows depend on its position.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from torch import Tensor, nn

from ..attention.base import Attention
from .attach import module_attention
from .cache import RecurrentLayer
from .masks import key_padding_mask, local_pattern_covers
from .packing import packed_documents
from .rows import check_cross_step, check_last_rows

#: Arguments of transformers' attention functions that change the maths and that kattn
#: mechanisms cannot apply.
_REFUSED = ("softcap", "position_bias", "s_aux", "sinks")


def attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention of ``module`` by its kattn mechanism (see the module docstring).

    Returns:
        ``(output (B, Lq, H, Dv), None)``: kattn mechanisms form no attention weights.
    """
    for name in _REFUSED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"{name}: kattn mechanisms cannot apply it (they never form the attention "
                "logits it changes); use an implementation of transformers for this model"
            )
    attn = module_attention(module)
    follow_scaling(module, attn, scaling)
    _set_dropout(module, attn, float(dropout))
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    key, value = _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1])
    _check_window(kwargs.get("sliding_window"), attention_mask, key.shape[2])
    batch, lq, lk = query.shape[0], query.shape[2], key.shape[2]
    layer = _cache_layer(module)
    documents = packed_documents(attention_mask, kwargs, batch=batch, lq=lq, lk=lk, causal=causal)
    if documents is not None:  # (a cache that forward made keeps no state of them)
        if layer is not None:
            layer.packed = True
        return _attend_packed(attn, query, key, value, documents, causal), None
    padding = key_padding_mask(attention_mask, batch=batch, lq=lq, lk=lk, causal=causal)
    if layer is not None and causal:
        out = layer.attend(attn, query, key, value, padding)
    elif causal and lq < lk:
        check_last_rows(attn)
        out = _attend_last_rows(attn, query, key, value, padding)
    else:
        if not causal:
            check_cross_step(attn, getattr(module, "_kattn_decoded", 0) - lq)
        out = attn(query, key, value, causal=causal, key_padding_mask=padding)
    return out.transpose(1, 2).contiguous(), None


def _attend_packed(
    attn: Attention, q: Tensor, k: Tensor, v: Tensor, documents: Tensor, causal: bool
) -> Tensor:
    """Attention of the packed documents that ``documents`` (``cu_seqlens`` over the rows
    laid end to end) delimits; returns ``(B, L, H, Dv)``."""
    b, h, length = q.shape[:3]
    q, k, v = (x.transpose(0, 1).reshape(1, h, b * length, x.shape[-1]) for x in (q, k, v))
    out = attn.forward_packed(q, k, v, documents, causal=causal)  # (1, H, B·L, Dv)
    return out[0].reshape(h, b, length, -1).permute(1, 2, 0, 3).contiguous()


def _cache_layer(module: nn.Module) -> RecurrentLayer | None:
    cache = getattr(module, "_kattn_cache", None)
    idx = getattr(module, "layer_idx", None)
    if cache is None or idx is None or idx >= len(cache.layers):
        return None
    layer = cache.layers[idx]
    return layer if isinstance(layer, RecurrentLayer) else None


def _attend_last_rows(
    attn: Attention, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None
) -> Tensor:
    """Causal attention of ``Lq`` queries that follow ``Lk − Lq`` cached keys."""
    lq, lk = q.shape[2], k.shape[2]
    padded = q.new_zeros(q.shape[0], q.shape[1], lk, q.shape[3])
    padded[:, :, lk - lq :] = q
    return attn(padded, k, v, causal=True, key_padding_mask=padding)[:, :, lk - lq :]


def _repeat_kv(x: Tensor, heads: int) -> Tensor:
    """Key/value heads ``(B, Hkv, L, ·)`` repeated to ``heads`` (query head h reads key/value
    head ``h // (heads / Hkv)``, as in grouped-query attention)."""
    hkv = x.shape[1]
    if hkv == heads:
        return x
    if heads % hkv:
        raise ValueError(f"{heads} query heads cannot share {hkv} key/value heads evenly")
    return x.repeat_interleave(heads // hkv, dim=1)


def follow_scaling(module: nn.Module, attn: Attention, scaling: float | None) -> None:
    """Give ``attn`` the call's ``scaling`` of the logits ``q·k``.

    A mechanism whose scale is softmax's ``1/√D`` by default, built without a ``scale``
    option, takes the call's scaling (OPT, for one, scales its queries itself and calls with
    1.0); the attribute is read at each forward, so its tensors stay as they are. A ``scale``
    option must equal the call's scaling (``NotImplementedError`` otherwise); a mechanism with
    a kernel of its own keeps its scale (:func:`kattn.hf.attach.build_for` warns).
    """
    if scaling is None or not hasattr(attn, "scale"):
        return
    own: Any = attn
    current = own.scale if own.scale is not None else attn.head_dim**-0.5
    if math.isclose(float(scaling), float(current), rel_tol=1e-9):
        return
    if getattr(module, "_kattn_follows_scaling", False):
        own.scale = float(scaling)
    elif "scale" in getattr(module, "_kattn_options", {}):
        raise NotImplementedError(
            f"scale: the option sets {float(current):.6g} but the model scales this "
            f"layer's attention logits by {float(scaling):.6g}; leave scale out (the "
            "kattn module then takes the model's)"
        )


def _set_dropout(module: nn.Module, attn: Attention, dropout: float) -> None:
    """The rate transformers passes (the config's, 0 in eval) as the mechanism's dropout of
    attention weights; a warning, once per module, where the mechanism has none."""
    if attn.supports_attention_dropout:
        attn.dropout = dropout
    elif dropout > 0 and attn.training and not getattr(module, "_kattn_warned_dropout", False):
        module._kattn_warned_dropout = True  # type: ignore[assignment]
        warnings.warn(
            f"{type(attn).__name__} has no attention-weight matrix to drop out: the model's "
            f"attention dropout ({dropout}) is not applied",
            stacklevel=3,
        )


def _check_window(window: int | None, mask: Tensor | None, lk: int) -> None:
    """A sliding window that does not cover the keys (of consecutive positions, the queries
    among them) is a pattern kattn cannot apply."""
    if window is None:
        return
    total = mask.shape[-1] if isinstance(mask, Tensor) else lk
    if not local_pattern_covers(int(window), 0, total, chunks=False):
        raise NotImplementedError(
            f"sliding_window={window} is shorter than the {total} keys: kattn mechanisms "
            "attend to every key (set config.sliding_window = None to use one)"
        )
