"""Decaying relative positions: ``c_{j−i} = Σ_r α_r γ_r^{|j−i|}``, recurrent in O(1) per token."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import positive_int
from ..functional.decay import (
    decay_init_state,
    decay_linear_attention,
    decay_log_coefficients,
    decay_prefill,
    decay_step,
)
from ..functional.linear_causal import LinearState
from ..functional.numerics import DEFAULT_EPS
from ..registry import register_encoding
from .base import RelativePositionBias


class DecayBias(RelativePositionBias):
    """A sum of ``decay_terms`` exponential decays per head and direction (past ``j <= i``,
    future ``j > i``), with learnable weights ``α_r = exp(log_alpha) > 0`` and rates
    ``γ_r = sigmoid(decay_logit) ∈ (0, 1)``.

    Initialised with ``α_r = 1/R`` and ``γ_r = 1 − 2^{−(2 + 3r)}`` (about 4, 32, 256, ...
    tokens), the same for every head and both directions. The default ``"recurrent"`` method is
    exact and linear in L (chunkwise-parallel decaying recurrences); decoding costs
    O(R·M·Dv) per token whatever the position. Other methods: ``"fft"``, ``"dense"``.
    """

    methods = ("recurrent", "fft", "dense")

    def __init__(
        self,
        *,
        num_heads: int,
        max_len: int | None = None,
        decay_terms: int = 3,
        method: str | None = None,
    ):
        super().__init__(num_heads=num_heads, max_len=max_len, method=method)
        positive_int("decay_terms", decay_terms)
        self.decay_terms = decay_terms
        gamma = torch.tensor([1.0 - 2.0 ** -(2 + 3 * r) for r in range(decay_terms)])
        shape = (num_heads, 2, decay_terms)
        self.log_alpha = nn.Parameter(torch.full(shape, -math.log(decay_terms)))
        self.decay_logit = nn.Parameter(torch.logit(gamma, eps=None).expand(shape).clone())

    def log_gamma(self) -> Tensor:
        """``(H, 2, R)`` ``log γ`` (side 0: past, side 1: future)."""
        return F.logsigmoid(self.decay_logit)

    def log_coefficients(self, lq: int, lk: int) -> Tensor:
        return decay_log_coefficients(self.log_alpha, self.log_gamma(), lq, lk)

    def _attend_fast(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        return decay_linear_attention(phi_q, phi_k, v, self.log_alpha, self.log_gamma(), **kwargs)

    def init_state(
        self, batch_size: int, num_features: int, *, device: Any, dtype: torch.dtype
    ) -> LinearState:
        return decay_init_state(
            batch_size, self.num_heads, self.decay_terms, num_features, device=device, dtype=dtype
        )

    def step(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: LinearState,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
    ) -> tuple[Tensor, LinearState]:
        return decay_step(
            phi_q,
            phi_k,
            v,
            state,
            self.log_alpha,
            self.log_gamma(),
            k_log_scale=k_log_scale,
            eps=eps,
        )

    def prefill(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: LinearState,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
        **kwargs: Any,
    ) -> tuple[Tensor, LinearState]:
        return decay_prefill(
            phi_q,
            phi_k,
            v,
            state,
            self.log_alpha,
            self.log_gamma(),
            k_log_scale=k_log_scale,
            eps=eps,
            **kwargs,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, decay_terms={self.decay_terms}"


register_encoding("decay", DecayBias)
