"""SimpleTRON: unnormalised linear attention ``Q (Kᵀ V) / √n`` (Yorsh 2022, §4.2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import positive_int
from ..functional.linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE
from ..functional.simpletron import (
    SimpletronState,
    check_causal_scale,
    simpletron_attention,
    simpletron_attention_reference,
    simpletron_init_state,
    simpletron_prefill,
    simpletron_step,
)
from ..registry import register_mechanism
from .base import Attention, sums_in_float32


class SimpletronAttention(Attention):
    """``z_i = q_i·Σ_j k_j v_jᵀ / √n``: φ = identity and no row normaliser (Yorsh, The Study
    of Linear Self-Attention Mechanism in Transformer, bachelor's thesis, CTU Prague 2022,
    §4.2, "SimpleTRON").

    n is the number of non-padded keys (at least 1), which is the thesis's ``1/√L`` when
    nothing is padded. Causal, as the thesis's recurrent form: ``z_i = q_i·S_i`` with
    ``S_i = S_{i−1} + k_i v_iᵀ``, ``S_0 = 0`` and no scale; ``causal_scale="sqrt_prefix_count"``
    divides by ``√n_i`` instead (n_i the non-padded keys at positions ``j <= i``), a kattn
    variant that keeps outputs from growing like ``√i``. Either way the causal forward equals
    the recurrent steps. O(L·D·Dv) non-causal, chunkwise-parallel causal, O(D·Dv) per recurrent
    step with a constant-size :class:`SimpletronState`.

    Args:
        causal_scale: ``"none"`` (the thesis) or ``"sqrt_prefix_count"``; causal form and
            recurrent steps only.
        chunk_size: tokens per chunk of the causal chunkwise-parallel form.
        block_size: tokens per block of chunks computed together (memory/speed trade-off).
    """

    supports_recurrent = True
    # no random features, landmarks or redraws: the formula above, computed as written
    is_exact = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        causal_scale: str = "none",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        positive_int("chunk_size", chunk_size)
        positive_int("block_size", block_size)
        self.causal_scale = check_causal_scale(causal_scale)
        self.chunk_size = chunk_size
        self.block_size = block_size

    @sums_in_float32
    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return simpletron_attention(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            causal_scale=self.causal_scale,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return simpletron_attention_reference(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            causal_scale=self.causal_scale,
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> SimpletronState:
        return simpletron_init_state(
            batch_size, self.num_heads, self.head_dim, device=device, dtype=dtype
        )

    @sums_in_float32
    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: Any
    ) -> tuple[Tensor, SimpletronState]:
        return simpletron_step(q_t, k_t, v_t, state, causal_scale=self.causal_scale)

    @sums_in_float32
    def _prefill(
        self, q: Tensor, k: Tensor, v: Tensor, state: Any
    ) -> tuple[Tensor, SimpletronState]:
        return simpletron_prefill(
            q,
            k,
            v,
            state,
            causal_scale=self.causal_scale,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"causal_scale={self.causal_scale!r}, chunk_size={self.chunk_size}, "
            f"block_size={self.block_size}"
        )


register_mechanism(
    "simpletron",
    SimpletronAttention,
    summary="SimpleTRON: unnormalised linear attention with φ = identity, Q(KᵀV)/√n with n "
    "the non-padded keys; causal q_i·S_i unscaled, as the thesis.",
    reference="Yorsh, The Study of Linear Self-Attention Mechanism in Transformer, bachelor's "
    "thesis, CTU Prague 2022, §4.2",
    complexity="O(L·D·Dv) time, O(L·(D+Dv) + D·Dv) memory; causal chunkwise O(L·C·(D+Dv)); "
    "O(D·Dv) per recurrent step",
    colour="#e377c2",
)
