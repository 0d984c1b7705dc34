"""SMYRF (Daras, Kitaev, Odena, Dimakis, SMYRF: Efficient Attention using Asymmetric
Clustering, NeurIPS 2020): softmax inside balanced clusters of asymmetrically hashed queries
and keys, several hashing rounds merged by log-sum-exp.

How it differs from the released code (``giannisdaras/smyrf``, ``smyrf/torch/attn.py``, read,
not copied):

- The released ``SmyrfAttention`` needs ``Lq / q_cluster_size == Lk / k_cluster_size`` and
  lengths that the cluster sizes divide. Here one ``cluster_size`` sets
  C = ⌈max(Lq, Lk)/cluster_size⌉ and each side is cut into C clusters whose sizes differ by
  at most one, so any lengths work.
- It draws new hash directions from torch's global RNG at every call, in eval too, and shares
  them over the batch and the heads. Here they come from the module's own seed (fixed in
  eval, redrawn per training forward) and are shared over the batch and the heads as there.
- With a padding mask it sorts padded queries and keys last but still cuts the clusters from
  the padded length, so the last clusters can hold padding only, and it takes the maximum
  norms M_Q, M_K over padded rows too. Here clusters are cut from the real rows alone and the
  norms are maxima over the real rows.
- Dropout of attention weights and k-means clustering are not implemented.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from ..checks import int_at_least, positive_float_or_none, positive_int
from ..features.base import in_backward
from ..functional.smyrf import smyrf_attention, smyrf_attention_reference
from ..registry import register_mechanism
from .base import Attention


class SmyrfAttention(Attention):
    """SMYRF attention (Daras et al. 2020, §3; :mod:`kattn.functional.smyrf`).

    Queries and keys go through the asymmetric XBOX+ transform
    (``F(q) = [q; √(M_Q² + M_K² − ‖q‖²); 0]``, ``G(k) = [k; 0; √(M_Q² + M_K² − ‖k‖²)]``, so
    Euclidean distance ranks the pairs by inner product), are hashed by a random projection
    per round (E2LSH) and sorted; each sorted order is cut into C = ⌈max(Lq, Lk)/cluster_size⌉
    balanced clusters, query cluster c attends to key cluster c with exact softmax, and the
    ``num_hashes`` rounds are merged by their log-sum-exp. O(R·(L log L + L·cluster_size·D))
    time, O(R·L·cluster_size) memory.

    Defaults from the released code's GLUE runs (``examples/nlp/downstream.py``: 2 hashes,
    clusters of 32 queries and 32 keys; SMYRF-BERT 2×32 in the paper's GLUE table):
    ``num_hashes=2``, ``cluster_size=32``.

    Randomness: the ``(num_hashes, D + 2)`` hash directions come from a generator owned by
    the module, seeded from ``seed`` (never torch's global RNG): fixed in ``eval()`` (the same
    for every call and every batch item, so an example's output does not depend on the rest
    of its batch) and drawn afresh by each training forward (draw 1, 2, … of a sequence fixed
    by the seed; the forward that activation checkpointing re-runs reuses its draw). The seed
    and the number of training draws are the module's extra state in ``state_dict()``.

    Padding: padded keys get no rank and the key clusters are cut from the real keys; with
    Lq == Lk the mask marks padded queries too (left out of the clusters, zero output).
    Cross-attention (Lq ≠ Lk) keeps C clusters on both sides (the shorter side has smaller
    ones). Causal attention is refused (see :meth:`_why_not`); there is no recurrent form.

    Args:
        num_hashes: R, hashing rounds, a positive int.
        cluster_size: about how many queries (and keys) per cluster, a positive int.
        seed: the seed of the hash directions, an int >= 0.
        scale: logit scale, default ``1/√D``.
    """

    supports_causal = False
    supports_cross = True
    supports_recurrent = False
    is_exact = False

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        num_hashes: int = 2,
        cluster_size: int = 32,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            num_hashes=num_hashes, cluster_size=cluster_size, seed=seed, scale=scale
        )
        self.num_hashes = positive_int("num_hashes", num_hashes)
        self.cluster_size = positive_int("cluster_size", cluster_size)
        self.seed = int_at_least("seed", seed, 0)
        self.scale = positive_float_or_none("scale", scale)
        self._draws = 0  # training draws so far
        self._eval_projections: dict[str, Tensor] = {}

    # ------------------------------------------------------------------------ hash directions
    def projections(self, device: torch.device | str | None = None) -> Tensor:
        """The evaluation-mode hash directions ``(num_hashes, D + 2)`` (float64, cached)."""
        key = str(torch.device(device or "cpu"))
        if key not in self._eval_projections:
            self._eval_projections[key] = self._draw(0, device)
        return self._eval_projections[key]

    def _draw(self, draw: int, device: Any) -> Tensor:
        """Draw ``draw`` (0 for eval, 1, 2, … in training) from a generator seeded by the
        module's seed and the draw number."""
        digest = hashlib.sha256(f"smyrf/{self.seed}/{draw}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        shape = (self.num_hashes, self.head_dim + 2)
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(device)

    def _current_projections(self, device: Any) -> Tensor:
        if not self.training:
            return self.projections(device)
        if not in_backward():
            self._draws += 1
        return self._draw(self._draws, device)

    # ------------------------------------------------------------------------------ forward
    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return (
                ": its balanced clusters are cut from the hash ranks of the whole sequence, so "
                "which earlier keys a query shares a cluster with depends on later tokens"
            )
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return smyrf_attention(
            q,
            k,
            v,
            self._current_projections(q.device),
            cluster_size=self.cluster_size,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return smyrf_attention_reference(
            q,
            k,
            v,
            self.projections(q.device),
            cluster_size=self.cluster_size,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
        )

    # -------------------------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, int]:
        """The seed and the number of training draws: a reloaded module has the same eval
        directions and continues the same sequence of training draws."""
        return {"seed": self.seed, "draws": self._draws}

    def set_extra_state(self, state: Any) -> None:
        ok = isinstance(state, dict) and all(
            isinstance(state.get(key), int) and state[key] >= 0 for key in ("seed", "draws")
        )
        if not ok:
            raise ValueError(f"expected {{'seed': int >= 0, 'draws': int >= 0}}, got {state!r}")
        self.seed, self._draws = state["seed"], state["draws"]
        self._eval_projections.clear()

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"num_hashes={self.num_hashes}, cluster_size={self.cluster_size}, "
            f"seed={self.seed}, scale={self.scale}"
        )


register_mechanism(
    "smyrf",
    SmyrfAttention,
    summary="Softmax inside balanced clusters of asymmetrically hashed (XBOX+, E2LSH) queries "
    "and keys, hashing rounds merged by log-sum-exp.",
    reference="Daras, Kitaev, Odena, Dimakis, SMYRF: Efficient Attention using Asymmetric "
    "Clustering, NeurIPS 2020",
    complexity="O(R·(L log L + L·C·D)) time, O(R·L·C) memory (R = num_hashes rounds, "
    "C = cluster_size)",
    approximates="softmax",
    size_option="cluster_size",
)
