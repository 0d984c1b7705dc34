"""Gated random feature attention, RFA-Gate (Peng et al., Random Feature Attention, ICLR 2021,
§3.3): ``S_t = g_t S_{t−1} + (1 − g_t) φ(k_t) v_tᵀ``, ``z_t = g_t z_{t−1} + (1 − g_t) φ(k_t)``,
``out_t = φ(q_t)·S_t / φ(q_t)·z_t`` with a scalar gate ``g_t = σ(w·k_t + b)`` per head.

The paper computes the gate from the layer input x_t; an attention module here receives the
projected heads only, so the gate reads the head's key k_t (a linear function of x_t, so this
is the paper's gate with ``w_x = W_kᵀ w``, restricted to the key's subspace). The maths is in
:mod:`kattn.functional.gated_linear`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as lin
from ..functional.gated_linear import (
    gated_linear_attention,
    gated_linear_attention_prefill,
    gated_linear_attention_step,
    gated_log_weights,
)
from ..functional.linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE, LinearState
from ..functional.numerics import zero_padded
from ..registry import register_mechanism
from .base import sums_in_float32
from .feature_attention import FeatureMapAttention


class GatedRandomFeatureAttention(FeatureMapAttention):
    """RFA-Gate: random feature attention with a learned forget gate per token and head.

    Causal attention is the paper's recurrence, computed chunkwise in parallel for training
    and one token at a time (O(M·Dv) state) for decoding. The paper's gate is causal only;
    ``causal=False`` here runs the recurrence both ways (key j > i weighs
    ``(1 − g_j) Π_{i<=l<j} g_l``, the mirror image of the causal weight) — a kattn extension.
    Gates pair query i with key i, so Lq must equal Lk.

    Args:
        feature_map: a name from ``kattn.features.available()``; default ``"trf"``, the
            trigonometric random features of RFA (the ``rfa`` preset's map).
        scale: the kernel sees ``scale · q·k``; default ``1/√D`` for maps that estimate
            ``exp(q·k)`` (and the learned spectral maps), else 1, as in ``kernelized``.
        gate_bias: the initial bias b of every head's gate. Default 0, as the released code
            initialises its gate projection's bias; the weights w start Xavier-uniform (as its
            gate projection), so at the start the gates spread around σ(0) = 0.5 with the keys.
            A larger bias (e.g. 3, g ≈ 0.95) starts with a longer memory.
        chunk_size: tokens per chunk of the chunkwise-parallel form.
        block_size: tokens per block of chunks computed together (memory/speed trade-off).
        eps: guard of the normaliser (default 1e-30 for positive maps, 1e-6 for signed ones).
        **options: options of the feature map (``num_features``, ``sampling``, ``redraw``,
            ``generator`` for ``trf``/``prf``).
    """

    supports_cross = False
    supports_recurrent = True
    default_feature_map = "trf"
    gate_weight: nn.Parameter
    gate_bias: nn.Parameter

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        feature_map: str = "trf",
        scale: float | None = None,
        gate_bias: float = 0.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        eps: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(scale=scale, eps=eps, gate_bias=gate_bias)
        if not math.isfinite(gate_bias):
            raise ValueError(f"gate_bias must be finite, got {gate_bias!r}")
        self._build_feature_map(
            feature_map, scale=scale, eps=eps, chunk_size=chunk_size, block_size=block_size,
            options=options,
        )  # fmt: skip
        bound = math.sqrt(6.0 / (head_dim + 1))  # Xavier-uniform of a (D → 1) projection
        self.gate_weight = nn.Parameter(torch.empty(num_heads, head_dim).uniform_(-bound, bound))
        self.gate_bias = nn.Parameter(torch.full((num_heads,), float(gate_bias)))

    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return (
                ": its gates run one recurrence over the sequence, pairing query i with key i, "
                "so Lq must equal Lk"
            )
        return ""

    # ------------------------------------------------------------------------------ maths
    def gate_logits(self, k: Tensor) -> Tensor:
        """``w_h·k_t + b_h`` ``(B, H, L)`` in the accumulation dtype: ``g_t = σ(·)``."""
        k = k.to(lin.accumulation_dtype(k.dtype))
        w = self.gate_weight.to(k.dtype)
        return (k @ w[:, :, None])[..., 0] + self.gate_bias.to(k.dtype)[:, None]

    @sums_in_float32
    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        if self.training:
            self.feature_map.training_step()
        k, v = zero_padded(key_padding_mask, k, v)
        fk = self.features(k)
        return gated_linear_attention(
            self.query_features(q),
            fk.values,
            v,
            self.gate_logits(k),
            causal=causal,
            k_log_scale=fk.log_scale,
            key_padding_mask=key_padding_mask,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
            eps=self.eps,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        """``(W ⊙ φ̃(Q)φ̃(K)ᵀ) V`` normalised row-wise, with the dense weights
        ``W_ij = exp(log(1 − g_j) + c_i − c_j + s_j − m_i)`` for j <= i (mirrored for j > i
        when not causal; see :func:`~kattn.functional.gated_linear.gated_log_weights`), φ̃ the
        bounded feature values, s the key log-scales and m_i the row's largest visible
        log-weight (it cancels in the ratio and puts ``eps`` in the units of the fast path)."""
        k, v = zero_padded(key_padding_mask, k, v)
        fq = self.features(q).values
        fk = self.features(k)
        log_w = gated_log_weights(
            self.gate_logits(k), causal=causal, key_padding_mask=key_padding_mask
        )
        return self._weighted_reference(
            fq, fk, v, log_w, causal=causal, key_padding_mask=key_padding_mask
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> LinearState:
        return lin.linear_attention_init_state(
            batch_size, self.num_heads, self.feature_map.num_features, 0, device=device, dtype=dtype
        )

    @sums_in_float32
    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: LinearState
    ) -> tuple[Tensor, LinearState]:
        fk = self.features(k_t)
        return gated_linear_attention_step(
            self.query_features(q_t),
            fk.values,
            v_t,
            self.gate_logits(k_t),
            state,
            k_log_scale=fk.log_scale,
            eps=self.eps,
        )

    @sums_in_float32
    def _prefill(
        self, q: Tensor, k: Tensor, v: Tensor, state: LinearState
    ) -> tuple[Tensor, LinearState]:
        fk = self.features(k)
        return gated_linear_attention_prefill(
            self.query_features(q),
            fk.values,
            v,
            self.gate_logits(k),
            state,
            k_log_scale=fk.log_scale,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"feature_map={self.feature_map_name!r}, scale={self.scale:.4g}"
        )


register_mechanism(
    "rfa_gate",
    GatedRandomFeatureAttention,
    summary="Gated random feature attention (RFA-Gate): trigonometric random features with a "
    "learned per-head forget gate on the recurrent state (recency bias).",
    reference="Peng et al., Random Feature Attention, ICLR 2021 (§3.3)",
    complexity="O(L·M·(D+Dv)) time, O(L·M + M·Dv) memory; causal chunkwise O(L·C·(M+Dv)); "
    "O(M·Dv) per recurrent step",
    size_option="num_features",
    colour="#c5b0d5",
)
