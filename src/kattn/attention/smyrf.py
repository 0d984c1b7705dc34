"""SMYRF (Daras, Kitaev, Odena, Dimakis, SMYRF: Efficient Attention using Asymmetric
Clustering, NeurIPS 2020): softmax inside balanced clusters of asymmetrically hashed queries
and keys, several hashing rounds merged by log-sum-exp.

How it differs from the released code (``giannisdaras/smyrf``, ``smyrf/torch/attn.py``, read,
not copied):

- The released ``SmyrfAttention`` needs ``Lq / q_cluster_size == Lk / k_cluster_size`` and
  lengths that the cluster sizes divide. Here one ``cluster_size`` sets
  C = ⌈max(nq, nk)/cluster_size⌉ from each example's real query and key counts, and each
  side is cut into C clusters whose sizes differ by at most one, so any lengths work and an
  example's clusters do not depend on the padding of its batch.
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

from typing import Any

import torch
from torch import Tensor

from ..checks import positive_float_or_none, positive_int
from ..functional.smyrf import smyrf_attention, smyrf_attention_reference
from ..registry import register_mechanism
from .base import Attention
from .seeded import SeededDraws


class SmyrfAttention(SeededDraws, Attention):
    """SMYRF attention (Daras et al. 2020, §3; :mod:`kattn.functional.smyrf`).

    Queries and keys go through the asymmetric XBOX+ transform
    (``F(q) = [q; √(M_Q² + M_K² − ‖q‖²); 0]``, ``G(k) = [k; 0; √(M_Q² + M_K² − ‖k‖²)]``, so
    Euclidean distance ranks the pairs by inner product), are hashed by a random projection
    per round (E2LSH) and sorted; each sorted order is cut into
    C = ⌈max(nq, nk)/cluster_size⌉ balanced clusters (nq, nk: the example's real queries and
    keys, so the padding of the batch changes nothing), query cluster c attends to key
    cluster c with exact softmax, and the ``num_hashes`` rounds are merged by their
    log-sum-exp. O(R·(L log L + L·cluster_size·D))
    time, O(R·L·cluster_size) memory.

    Defaults from the released code's GLUE runs (``examples/nlp/downstream.py``: 2 hashes,
    clusters of 32 queries and 32 keys; SMYRF-BERT 2×32 in the paper's GLUE table):
    ``num_hashes=2``, ``cluster_size=32``.

    Randomness: the ``(num_hashes, D + 2)`` hash directions follow the seeded contract of
    :mod:`kattn.attention.seeded` (a generator owned by the module, the same for every batch
    item, fixed in ``eval()``, redrawn per training forward, reused under checkpointing, seed
    and draws in ``state_dict()``).

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
    rows_depend_on_other_queries = True  # the clusters are built from all queries
    draw_stream = "smyrf"

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
        self.scale = positive_float_or_none("scale", scale)
        self._init_seeded(seed)

    # ------------------------------------------------------------------------ hash directions
    def projections(self, device: torch.device | str | None = None) -> Tensor:
        """The evaluation-mode hash directions ``(num_hashes, D + 2)`` (float64, cached)."""
        return self._projections(0, device)

    def _projections(self, draw: int, device: Any) -> Tensor:
        """Draw ``draw`` (0 for eval, 1, 2, … in training) of i.i.d. N(0, 1) directions."""
        shape = (self.num_hashes, self.head_dim + 2)
        return self._drawn_normal(shape, (), draw, device)

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
            self._projections(self._current_draw(), q.device),
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
    colour="#3182bd",
)
