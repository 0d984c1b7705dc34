"""Exact softmax attention (the reference every other mechanism is compared with)."""

from __future__ import annotations

from torch import Tensor

from ..functional.softmax import softmax_attention
from ..registry import register_mechanism
from .base import Attention


class SoftmaxAttention(Attention):
    """``softmax(q kᵀ · scale) v`` through ``scaled_dot_product_attention``.

    Args:
        scale: logit scale, default ``1/√D``.
        dropout: dropout probability on the attention weights, applied in training only.
    """

    is_exact = True
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
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.scale = scale
        self.dropout = dropout

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
            dropout_p=self.dropout if self.training else 0.0,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"scale={self.scale}, dropout={self.dropout}"
        )


register_mechanism(
    "softmax",
    SoftmaxAttention,
    summary="Exact scaled dot-product softmax attention (the reference).",
    reference="Vaswani et al., Attention Is All You Need, NeurIPS 2017",
    complexity="O(L²·D) time; O(L) memory with fused kernels, O(L²) otherwise",
)
