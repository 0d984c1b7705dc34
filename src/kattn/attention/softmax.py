"""Exact softmax attention (the reference every other mechanism is compared with)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import positive_float_or_none
from ..functional.softmax import (
    KVCache,
    softmax_attention,
    softmax_attention_reference,
    softmax_init_state,
    softmax_prefill,
    softmax_step,
)
from ..registry import register_mechanism
from .base import Attention


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
        positive_float_or_none("scale", scale)
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
        return softmax_init_state(
            batch_size, self.num_heads, self.head_dim, device=device, dtype=dtype
        )

    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: KVCache
    ) -> tuple[Tensor, KVCache]:
        return softmax_step(q_t, k_t, v_t, state, scale=self.scale)

    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, state: KVCache) -> tuple[Tensor, KVCache]:
        """The L new queries attend to the cached keys and, causally, to the new ones; the
        new keys and values are appended to the cache in one copy (:func:`softmax_prefill`)."""
        return softmax_prefill(q, k, v, state, scale=self.scale)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"scale={self.scale}, dropout={self.dropout}"
        )


register_mechanism(
    "softmax",
    SoftmaxAttention,
    summary="Exact scaled dot-product softmax attention (the reference); decodes with a "
    "key/value cache.",
    reference="Vaswani et al., Attention Is All You Need, NeurIPS 2017",
    complexity="O(L²·D) time; O(L) memory with fused kernels, O(L²) otherwise",
    colour="#000000",
)
