"""Exact softmax attention (the reference every other mechanism is compared with)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional.softmax import softmax_attention, softmax_attention_reference
from ..registry import register_mechanism
from .base import Attention


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


class SoftmaxAttention(Attention):
    """``softmax(q kᵀ · scale) v`` through ``scaled_dot_product_attention``.

    Recurrent decoding keeps a :class:`KVCache`.

    Args:
        scale: logit scale, default ``1/√D``.
        dropout: dropout probability on the attention weights, applied in training only.
    """

    is_exact = True
    supports_recurrent = True
    supports_attention_dropout = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be positive or None, got {scale!r}")
        self.scale = scale
        self._set_dropout(dropout)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return softmax_attention(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
            dropout_p=self.dropout_p,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return softmax_attention_reference(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> KVCache:
        h, d = self.num_heads, self.head_dim
        return KVCache(
            torch.empty(batch_size, h, 0, d, device=device, dtype=dtype),
            torch.empty(batch_size, h, 0, 0, device=device, dtype=dtype),
            0,
        )

    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: KVCache
    ) -> tuple[Tensor, KVCache]:
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
        out = F.scaled_dot_product_attention(
            q_t, keys[:, :, :n], values[:, :, :n], scale=self.scale
        )
        return out, KVCache(keys, values, n)

    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, state: KVCache) -> tuple[Tensor, KVCache]:
        """The L new queries attend to the cached keys and, causally, to the new ones; the
        new keys and values are appended to the cache in one copy."""
        keys, values, length = _checked_cache(state, v)
        n = v.shape[2]
        keys = torch.cat([keys[:, :, :length].to(k.dtype), k], dim=2)
        values = torch.cat([values[:, :, :length].to(v.dtype), v], dim=2) if length else v
        if length:  # query i (position length + i) sees keys 0 … length + i
            rows = torch.arange(n, device=q.device)[:, None] + length
            allowed = torch.arange(length + n, device=q.device)[None, :] <= rows
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=allowed, scale=self.scale
            )
        else:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.scale)
        return out, KVCache(keys, values, length + n)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"scale={self.scale}, dropout={self.dropout}"
        )


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


register_mechanism(
    "softmax",
    SoftmaxAttention,
    summary="Exact scaled dot-product softmax attention (the reference).",
    reference="Vaswani et al., Attention Is All You Need, NeurIPS 2017",
    complexity="O(L²·D) time; O(L) memory with fused kernels, O(L²) otherwise",
    colour="#000000",
)
