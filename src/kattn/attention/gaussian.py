"""Exact Gaussian-kernel attention, the exact counterpart of Skyformer (Chen et al. 2021 eq. 3)."""

from __future__ import annotations

from torch import Tensor

from ..functional.gaussian import gaussian_attention, gaussian_attention_reference
from ..registry import register_mechanism
from .base import Attention


class GaussianAttention(Attention):
    """``κ(Q/p^¼, K/p^¼) V`` with ``κ(x, y) = exp(−‖x − y‖²/2)``, p = head dim, no row
    normalisation (Chen et al., Skyformer, NeurIPS 2021, "Kernelized Attention").

    Exact and O(Lq·Lk); causal, padding and cross-attention supported. Computed as
    ``exp(q·k − ‖q‖²/2 − ‖k‖²/2)`` with every exponent ``<= 0``: no overflow at any norm.

    Args:
        dropout: dropout probability on the kernel entries, in training only (the released
            code applies attention dropout 0.1 here).
    """

    is_exact = True
    supports_attention_dropout = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._set_dropout(dropout)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return gaussian_attention(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            dropout_p=self.dropout_p,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return gaussian_attention_reference(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask
        )

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


register_mechanism(
    "gaussian",
    GaussianAttention,
    summary="Exact Gaussian-kernel attention κ(Q/p^¼, K/p^¼)V without row normalisation "
    "(Skyformer's exact counterpart).",
    reference="Chen et al., Skyformer: Remodel Self-Attention with Gaussian Kernel and Nyström "
    "Method, NeurIPS 2021",
    complexity="O(Lq·Lk·(D+Dv)) time, O(Lq·Lk) memory",
    colour="#8c564b",
)
