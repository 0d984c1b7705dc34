"""Exact softmax attention, ``softmax(q kᵀ · scale) v`` (Vaswani et al., 2017). O(Lq·Lk·D).

Decoding keeps the keys and values seen so far (:class:`KVCache`): :func:`softmax_step` reads
one token in O(t·D) at position t, :func:`softmax_prefill` L tokens at once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import allowed_keys
from .numerics import zero_padded


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact softmax attention through :func:`torch.nn.functional.scaled_dot_product_attention`.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        causal: query i sees keys j <= i (Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding: those keys and values count
            nowhere (they are zeroed first, so not even a NaN or an infinity stored there
            reaches an output or a gradient through ``0 × NaN``).
        scale: logit scale, default ``1/√D``.
        dropout_p: dropout on the attention weights (pass 0 in evaluation).

    Returns:
        ``(B, H, Lq, Dv)``. A query that sees no key at all (fully padded) gets zeros, not NaN.
    """
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p
        )
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    assert allowed is not None
    k, v = zero_padded(key_padding_mask, k, v)
    # A row with no visible key would be softmax over nothing (NaN): let it see every key and
    # zero its output afterwards, which also keeps its gradient exactly zero.
    seen = allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed | ~seen, scale=scale, dropout_p=dropout_p
    )
    return out.masked_fill(~seen, 0.0)


def softmax_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Slow, explicit softmax attention: the full ``(Lq, Lk)`` weight matrix (plus ``bias``,
    broadcast to ``(B, H, Lq, Lk)``, when given), then ``@ v``.

    Padded keys and values are zeroed, then their weights set to 0 (see
    :func:`softmax_attention`).
    """
    if key_padding_mask is not None:
        k, v = zero_padded(key_padding_mask, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * scale  # (B, H, Lq, Lk)
    if bias is not None:
        logits = logits + bias
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is None:
        return torch.softmax(logits, dim=-1) @ v
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = torch.where(allowed.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ v


class KVCache(NamedTuple):
    """Decoding state of softmax attention: the keys and values seen so far.

    Attributes:
        keys: ``(B, H, capacity, D)``; values: ``(B, H, capacity, Dv)``; the first ``length``
            positions are filled. Capacity doubles when full, so appending is amortised O(1);
            memory and time per token grow with the sequence, unlike kernelized states.
            Steps write into these buffers, so continue from the latest state only; to
            branch (beam search), copy first: ``KVCache(keys.clone(), values.clone(), length)``.
        length: tokens in the cache.
    """

    keys: Tensor
    values: Tensor
    length: int


def softmax_init_state(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> KVCache:
    """The empty cache before any token (the first step sets the value dim Dv)."""
    return KVCache(
        torch.empty(batch_size, num_heads, 0, head_dim, device=device, dtype=dtype),
        torch.empty(batch_size, num_heads, 0, 0, device=device, dtype=dtype),
        0,
    )


def softmax_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, state: KVCache, *, scale: float | None = None
) -> tuple[Tensor, KVCache]:
    """One causal token: ``softmax(q_t kᵀ · scale) v`` over the cached keys and this one, in
    O(t·(D + Dv)) at position t.

    Args:
        q_t, k_t: ``(B, H, 1, D)``; v_t: ``(B, H, 1, Dv)``.
        state: from :func:`softmax_init_state` or the previous step. Without gradients the
            token is written into its buffers (grown when full); with gradients a new cache
            is built, leaving the tensors of earlier steps' graphs untouched.
        scale: logit scale, default ``1/√D``.

    Returns:
        The output ``(B, H, 1, Dv)`` and the cache with this token.
    """
    keys, values, length = _checked_cache(state, v_t)
    dv = v_t.shape[-1]
    keys, values = keys.to(k_t.dtype), values.to(v_t.dtype)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q_t, k_t, v_t, keys, values)):
        # differentiable: no writes into tensors that earlier steps' graphs hold
        keys = torch.cat([keys[:, :, :length], k_t], dim=2)
        values = torch.cat([values[:, :, :length], v_t], dim=2) if length else v_t
    else:
        if length == keys.shape[2] or values.shape[-1] != dv:
            keys, values = _grow(keys, values, length, dv)
        keys[:, :, length] = k_t[:, :, 0]
        values[:, :, length] = v_t[:, :, 0]
    n = length + 1
    out = F.scaled_dot_product_attention(q_t, keys[:, :, :n], values[:, :, :n], scale=scale)
    return out, KVCache(keys, values, n)


def softmax_prefill(
    q: Tensor, k: Tensor, v: Tensor, state: KVCache, *, scale: float | None = None
) -> tuple[Tensor, KVCache]:
    """L causal tokens after ``state`` at once: the L new queries attend to the cached keys
    and, causally, to the new ones (one masked ``scaled_dot_product_attention``); the new keys
    and values are appended to the cache in one copy.

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)``; state and scale as for
            :func:`softmax_step`.

    Returns:
        The outputs ``(B, H, L, Dv)`` and the cache after the L tokens.
    """
    keys, values, length = cache_appended(state, k, v)
    n = v.shape[2]
    if length:  # query i (position length + i) sees keys 0 … length + i
        rows = torch.arange(n, device=q.device)[:, None] + length
        allowed = torch.arange(length + n, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale)
    return out, KVCache(keys, values, length + n)


def cache_appended(state: Any, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, int]:
    """The cached keys and values followed by ``k`` and ``v`` (by concatenation, which keeps
    earlier graphs intact), and the cached length; ValueError unless ``state`` is a cache
    for them."""
    keys, values, length = _checked_cache(state, v)
    keys = torch.cat([keys[:, :, :length].to(k.dtype), k], dim=2)
    values = torch.cat([values[:, :, :length].to(v.dtype), v], dim=2) if length else v
    return keys, values, length


def _checked_cache(state: Any, v: Tensor) -> KVCache:
    """``state`` if it is a cache for values like ``v`` ``(B, H, L, Dv)``, else ValueError."""
    if not isinstance(state, KVCache):
        raise ValueError(f"state must be a KVCache (from init_state), got {type(state).__name__}")
    keys, values, length = state
    b, h, _, dv = v.shape
    if keys.shape[:2] != (b, h) or (length and values.shape[-1] != dv):
        raise ValueError(
            f"state holds keys {tuple(keys.shape)} and values {tuple(values.shape)}; "
            f"these tokens have batch {b}, heads {h}, value dim {dv}"
        )
    return state


def _grow(keys: Tensor, values: Tensor, length: int, dv: int) -> tuple[Tensor, Tensor]:
    """Copy the cache into buffers of twice the capacity (at least 16 positions)."""
    b, h, _, d = keys.shape
    capacity = max(16, 2 * keys.shape[2])
    new_keys = keys.new_empty(b, h, capacity, d)
    new_values = values.new_empty(b, h, capacity, dv)
    if length:
        new_keys[:, :, :length] = keys[:, :, :length]
        new_values[:, :, :length] = values[:, :, :length]
    return new_keys, new_values
