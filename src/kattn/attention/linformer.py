"""Linformer: softmax attention over keys and values projected along the sequence."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import positive_int
from ..functional.linformer import linformer_attention, linformer_attention_reference
from ..registry import register_mechanism
from .base import Attention


class LinformerAttention(Attention):
    """``softmax(Q (E K)ᵀ/√D) (F V)`` with learnable ``E, F ∈ R^{k×n}`` (Wang et al. 2020).

    Keys and values are projected along the sequence to ``proj_dim`` rows; padded keys are
    zeroed before projecting, so they contribute nothing. Sequences up to ``max_len`` (needed):
    a shorter one uses the first columns of the projection.

    Args:
        proj_dim: k, the projected length (128 in the Skyformer paper's LRA comparison).
        share_kv: one projection for keys and values (E = F, as the released code).
        share_heads: one projection for every head instead of one per head.
        projection: an existing ``nn.Parameter`` of shape ``(heads or 1, [2,] k, max_len)`` to
            share the projection across layers (build it once, pass it to each layer).
    """

    supports_causal = False
    limits_length = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        proj_dim: int = 128,
        share_kv: bool = True,
        share_heads: bool = False,
        projection: nn.Parameter | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(share_kv=share_kv, share_heads=share_heads)
        positive_int("proj_dim", proj_dim)
        assert max_len is not None
        shape = (1 if share_heads else num_heads, 1 if share_kv else 2, proj_dim, max_len)
        if projection is None:
            projection = nn.Parameter(torch.randn(shape) / math.sqrt(proj_dim))
        elif not isinstance(projection, nn.Parameter) or tuple(projection.shape) != shape:
            got = tuple(projection.shape) if isinstance(projection, Tensor) else projection
            raise ValueError(f"projection must be an nn.Parameter of shape {shape}, got {got}")
        self.projection = projection
        self.proj_dim = proj_dim
        self.share_kv = share_kv
        self.share_heads = share_heads

    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return ": each projected key mixes the whole sequence, future tokens included"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        proj = self.projection[..., : k.shape[2]]  # (H or 1, 1 or 2, k, Lk)
        return linformer_attention(
            q, k, v, proj[:, 0], proj[:, -1], key_padding_mask=key_padding_mask
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        proj = self.projection[..., : k.shape[2]]  # (H or 1, 1 or 2, k, Lk)
        return linformer_attention_reference(
            q, k, v, proj[:, 0], proj[:, -1], key_padding_mask=key_padding_mask
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, proj_dim={self.proj_dim}, "
            f"max_len={self.max_len}, share_kv={self.share_kv}, share_heads={self.share_heads}"
        )


register_mechanism(
    "linformer",
    LinformerAttention,
    summary="Linformer: softmax attention over keys and values projected along the sequence "
    "to proj_dim rows (learnable, shareable).",
    reference="Wang et al., Linformer: Self-Attention with Linear Complexity, 2020",
    complexity="O(L·k·(D+Dv)) time, O(L·k) memory (k = proj_dim); needs max_len",
    approximates="softmax",
    size_option="proj_dim",
    colour="#9467bd",
)
