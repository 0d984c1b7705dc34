"""Softmax attention with an additive bias on the logits, ``softmax(q kᵀ · scale + b) v``:
the relative-position bias ``b_{j−i}`` of Raffel et al. 2020 (T5) and Luo et al. 2021 (eq. 6),
the softmax counterpart of the multiplicative ``c_{j−i} = exp(b_{j−i})`` of kernelized
attention (Luo et al. eq. 10). O(Lq·Lk·D) time, O(Lq·Lk) memory for the bias.

Decoding keeps a :class:`~kattn.functional.KVCache` of the keys and values seen so far;
:func:`biased_softmax_prefill` reads L new tokens with the bias rows of their positions (one
token: a decoding step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import allowed_keys
from .numerics import zero_padded
from .softmax import KVCache, cache_appended, softmax_attention_reference


def biased_softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None = None,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``softmax(q kᵀ · scale + bias) v`` through ``scaled_dot_product_attention`` with the
    bias, the causal mask and the padding in one additive float mask.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        bias: ``(H, Lq, Lk)`` (or anything broadcastable to ``(B, H, Lq, Lk)``) added to the
            logits; None for none. Gradients flow to it.
        causal: query i sees keys j <= i (Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding: those keys and values count
            nowhere (zeroed first, so not even a NaN stored there reaches an output).
        scale: logit scale, default ``1/√D``.
        dropout_p: dropout on the attention weights (pass 0 in evaluation).

    Returns:
        ``(B, H, Lq, Dv)``. A query that sees no key at all (fully padded) gets zeros.
    """
    if bias is None and key_padding_mask is None:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p
        )
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    seen = None
    if key_padding_mask is not None:
        k, v = zero_padded(key_padding_mask, k, v)
    if allowed is not None:
        # a row with no visible key would be softmax over nothing (NaN): let it see every key
        # and zero its output afterwards, which also keeps its gradients exactly zero
        seen = allowed.any(dim=-1, keepdim=True)
        allowed = allowed | ~seen
    mask = _additive_mask(bias, allowed, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout_p)
    return out if seen is None else out.masked_fill(~seen, 0.0)


def biased_softmax_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None = None,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Slow, explicit :func:`biased_softmax_attention`: the ``(Lq, Lk)`` logits, the bias
    added, masked entries set to −∞, softmax, then ``@ v`` (rows that see no key give 0)."""
    return softmax_attention_reference(
        q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=scale, bias=bias
    )


def biased_softmax_prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: KVCache,
    bias: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, KVCache]:
    """L causal tokens after the ``t0`` tokens of ``state``: query i (position ``t0 + i``)
    attends to the cached keys and the new keys up to its own, with ``bias[..., i, j]`` added
    to its logit for key j; the new keys and values are appended to the cache.

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)``.
        state: a :class:`KVCache` (``kattn.functional.softmax_init_state``, or the result of
            a previous call).
        bias: ``(H, L, t0 + L)``, the rows of positions ``t0 … t0 + L − 1`` over keys
            ``0 … t0 + L − 1`` (entries after each row's own position are not read); None
            for none.
        scale: logit scale, default ``1/√D``.

    Returns:
        The outputs ``(B, H, L, Dv)`` and the cache after the L tokens (its capacity is its
        length: each call appends by concatenation, which keeps earlier graphs intact).
    """
    keys, values, t0 = cache_appended(state, k, v)
    n = v.shape[2]
    rows = torch.arange(n, device=q.device)[:, None] + t0
    allowed = torch.arange(t0 + n, device=q.device)[None, :] <= rows  # (L, t0 + L)
    mask = _additive_mask(bias, allowed, q.dtype)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out, KVCache(keys, values, t0 + n)


def _additive_mask(bias: Tensor | None, allowed: Tensor | None, dtype: torch.dtype) -> Tensor:
    """The float mask ``bias`` (0 without one) with −∞ where ``allowed`` is False; a bool mask
    when there is no bias."""
    if bias is None:
        assert allowed is not None
        return allowed
    bias = bias.to(dtype)
    return bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
