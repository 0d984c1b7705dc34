"""Skyformer: Gaussian-kernel attention by the modified Nyström method (Chen et al. 2021 §4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..checks import int_at_least, positive_float, positive_int_or_none
from ..functional.nystrom import (
    PINV_INITS,
    skyformer_attention,
    skyformer_attention_reference,
    skyformer_landmarks,
)
from ..registry import register_mechanism
from .base import Attention


class SkyformerAttention(Attention):
    """``C̄_{Q,S} (C̄_{S,S} + γI)^{-1} C̄_{S,K} V`` with ``C̄ = κ([Q;K], [Q;K])`` (Chen et al. 2021).

    Landmarks S: ``num_landmarks`` rows of ``[Q; K]`` drawn uniformly with replacement, half
    among the query rows and half among the non-padded key rows (with Lq == Lk the padding
    mask is taken to mark padded queries too, as in self-attention, and those are not drawn).
    They are redrawn for every example at every training call. In ``eval()`` one draw of
    uniforms from a fixed seed (``landmark_seed``, a buffer saved in the ``state_dict``) picks
    the landmarks of every example (the r-th allowed row for the same r), so an example's
    output is deterministic and does not depend on the batch it is in, nor on its place
    there. When ``Lq + Lk <= num_landmarks`` every (non-padded) row is a landmark.

    Args:
        num_landmarks: number of landmarks (paper: 128).
        gamma: the ridge γ (paper and code: 0.1).
        pinv_iterations: hyper-power iterations of the pseudo-inverse (6); None inverts
            exactly.
        pinv_init: the iteration's start Z₀ (:func:`kattn.functional.iterative_pinv`):
            ``"identity"`` (Z₀ = I, the paper's §4.4), ``"per_matrix"`` (Mᵀ scaled per
            matrix) or ``"global"`` (the released code's single scale over the batch,
            which makes an example's output depend on its batch). The default is the paper's:
            it inverts the core far more closely in six steps and trained no less stably
            (``benchmarks/pinv_init.py``; ``docs/nystrom.md``).
    """

    supports_causal = False
    rows_depend_on_other_queries = True  # landmarks drawn from the queries and keys

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        num_landmarks: int = 128,
        gamma: float = 0.1,
        pinv_iterations: int | None = 6,
        pinv_init: str = "identity",
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        int_at_least("num_landmarks", num_landmarks, 2)
        positive_float("gamma", gamma)
        positive_int_or_none("pinv_iterations", pinv_iterations)
        if pinv_init not in PINV_INITS:
            raise ValueError(f"pinv_init must be one of {PINV_INITS}, got {pinv_init!r}")
        self.num_landmarks = num_landmarks
        self.gamma = float(gamma)
        self.pinv_iterations = pinv_iterations
        self.pinv_init = pinv_init
        self.landmark_seed: Tensor
        seed = torch.randint(0, 2**62, (), dtype=torch.int64)
        self.register_buffer("landmark_seed", seed)

    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return (
                ": its Nyström approximation is built from landmarks of the whole sequence "
                "(a low-rank PSD completion), which a causal mask does not preserve; use "
                "'gaussian' for exact causal Gaussian-kernel attention"
            )
        return ""

    def landmarks(
        self, batch: int, lq: int, lk: int, key_padding_mask: Tensor | None, device: Any
    ) -> tuple[Tensor, Tensor]:
        """Landmark indices ``(B, S)`` into ``[Q; K]`` and their validity ``(B, S)``
        (:func:`kattn.functional.skyformer_landmarks`), from this call's uniforms."""
        uniforms = None
        if lq + lk > self.num_landmarks:  # else every row is a landmark
            n_q = self.num_landmarks // 2
            counts = (n_q, self.num_landmarks - n_q)
            if self.training:  # a fresh draw for every example
                draws = [torch.rand(batch, n, device=device) for n in counts]
            else:  # one draw from the module's seed for every example (see the class docstring)
                g = torch.Generator().manual_seed(int(self.landmark_seed))
                draws = [torch.rand(1, n, generator=g).to(device).expand(batch, n) for n in counts]
            uniforms = (draws[0], draws[1])
        return skyformer_landmarks(
            batch, lq, lk, uniforms, key_padding_mask=key_padding_mask, device=device
        )

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return self._with_landmarks(skyformer_attention, q, k, v, key_padding_mask)

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return self._with_landmarks(skyformer_attention_reference, q, k, v, key_padding_mask)

    def _with_landmarks(
        self,
        attention: Callable[..., Tensor],
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
    ) -> Tensor:
        """``attention`` (the fast path or its reference) with this module's landmarks and
        options."""
        index, ok = self.landmarks(q.shape[0], q.shape[2], k.shape[2], key_padding_mask, q.device)
        return attention(
            q,
            k,
            v,
            index,
            landmark_mask=None if key_padding_mask is None else ok,
            key_padding_mask=key_padding_mask,
            gamma=self.gamma,
            iterations=self.pinv_iterations,
            init=self.pinv_init,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"num_landmarks={self.num_landmarks}, gamma={self.gamma}, "
            f"pinv_iterations={self.pinv_iterations}, pinv_init={self.pinv_init!r}"
        )


register_mechanism(
    "skyformer",
    SkyformerAttention,
    summary="Skyformer: Gaussian-kernel attention by the modified Nyström method on [Q; K] "
    "landmarks (no row normalisation).",
    reference="Chen et al., Skyformer: Remodel Self-Attention with Gaussian Kernel and Nyström "
    "Method, NeurIPS 2021",
    complexity="O(L·S·(D+Dv) + S³) time, O(L·S + S²) memory (S landmarks)",
    approximates="gaussian",
    size_option="num_landmarks",
    colour="#d62728",
)
