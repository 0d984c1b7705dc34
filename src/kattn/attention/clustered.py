"""Clustered and improved clustered attention (Vyas, Katharopoulos, Fleuret, Fast
Transformers with Clustered Attention, NeurIPS 2020, §3.2–3.3).

How it differs from the released code (idiap/fast-transformers, ``clustered_attention.py``,
``improved_clustered_attention.py`` and the Hamming k-means and hashing extensions; read,
not copied):

- The released code draws the hyperplanes from torch's global RNG, the initial centroids
  from numpy's and the codes of empty clusters from an unseeded C++ generator, on every call
  (also in eval). Here every draw comes from a generator seeded by the module's seed: fixed
  in ``eval()``, a fresh draw per training forward, reproducible from ``state_dict()``.
- Its initial centroids are the codes of C random positions shared by the whole batch,
  padded positions included (and it fails when C exceeds the length); here each sequence
  starts from C distinct unpadded queries (spare random codes fill the slots beyond its
  number of unpadded queries), so padded queries never shape a centroid.
- Codes are ±1 vectors and Hamming distances come from one matmul, so ``bits`` is not
  limited to 63 (the released int64 codes are); the default stays 63.
- Attention dropout (released default 0.1) is not implemented, and the released causal
  variant (``causal-improved-clustered``) has no counterpart (see ``_why_not``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor

from ..checks import boolean, positive_float_or_none, positive_int
from ..functional.clustered import (
    cluster_queries,
    clustered_attention,
    clustered_attention_reference,
    improved_clustered_attention,
    improved_clustered_attention_reference,
)
from ..registry import register_mechanism
from .base import Attention
from .seeded import SeededDraws


class ClusteredAttention(SeededDraws, Attention):
    """Clustered attention (Vyas et al. 2020, §3.2): the queries of each sequence and head
    are hashed by ``bits`` random hyperplanes and grouped into ``num_clusters`` clusters by
    ``iterations`` Lloyd iterations of k-means in Hamming space; each cluster's centroid (the
    mean of its queries) attends to every key with softmax, and each query gets its
    centroid's output (:func:`kattn.functional.clustered_attention`). O(L·C·D) time and
    memory, no ``(L, L)`` tensor; exact when every query is its own cluster.

    Defaults, from the paper's experiments (§4: 63 bits, 10 Lloyd iterations; the speech
    models use 100 clusters, "clustered-100") and the released code (``hash_bias=True``):
    ``num_clusters=100``, ``iterations=10``, ``bits=63``, ``hash_bias=True``.

    Randomness (hyperplanes, initial centroids, codes of emptied clusters) follows the seeded
    contract of :mod:`kattn.attention.seeded` (a generator owned by the module, fixed in
    ``eval()``, redrawn per training forward, reused under checkpointing, seed and draws in
    ``state_dict()``). All sequences of a batch use the same draw and are clustered
    separately, so an example's output does not depend on its batch. No gradient flows
    through the assignment to clusters.

    Padding: padded keys count nowhere. In self-attention (Lq == Lk) the key padding mask
    also marks the padded queries: they take no part in k-means or the centroid means (they
    are assigned to their nearest centroid, so their outputs stay finite). Cross-attention
    clusters the queries and reads all keys. There is no causal form: a centroid averages
    queries of the whole sequence, so earlier outputs would depend on later tokens.

    Args:
        num_clusters: C, a positive int.
        iterations: Lloyd iterations (assignments), a positive int.
        bits: hyperplanes of the hash, a positive int.
        hash_bias: random hyperplane offsets, so that Hamming distance follows Euclidean
            distance; False: hyperplanes through the origin (it follows the angle).
        seed: the seed of the clustering draws, an int >= 0.
        scale: logit scale, default ``1/√D``.
    """

    supports_causal = False
    supports_cross = True
    supports_recurrent = False
    is_exact = False
    rows_depend_on_other_queries = True  # the clusters are built from all queries
    draw_stream = "clustered"
    #: the attention function and its dense reference, called on the clustering.
    _paths: ClassVar[tuple[Callable[..., Tensor], Callable[..., Tensor]]] = (
        clustered_attention,
        clustered_attention_reference,
    )

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        num_clusters: int = 100,
        iterations: int = 10,
        bits: int = 63,
        hash_bias: bool = True,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            num_clusters=num_clusters,
            iterations=iterations,
            bits=bits,
            hash_bias=hash_bias,
            seed=seed,
            scale=scale,
        )
        self.num_clusters = positive_int("num_clusters", num_clusters)
        self.iterations = positive_int("iterations", iterations)
        self.bits = positive_int("bits", bits)
        self.hash_bias = boolean("hash_bias", hash_bias)
        self.scale = positive_float_or_none("scale", scale)
        self._init_seeded(seed)

    # --------------------------------------------------------------------------- clustering
    def clusters(self, q: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """The evaluation-mode clustering of the queries ``q (B, H, Lq, D)``: ``(B, H, Lq)``
        cluster indices in ``[0, num_clusters)``. ``key_padding_mask (B, Lq)`` marks padded
        queries (self-attention)."""
        return self._cluster(q, key_padding_mask, 0)

    def _cluster(self, q: Tensor, query_padding_mask: Tensor | None, draw: int) -> Tensor:
        return cluster_queries(
            q,
            num_clusters=self.num_clusters,
            bits=self.bits,
            iterations=self.iterations,
            hash_bias=self.hash_bias,
            generator=self._generator(draw),
            query_padding_mask=query_padding_mask,
        )

    # ------------------------------------------------------------------------------ forward
    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return (
                ": a centroid is the mean of queries from the whole sequence and the keys a "
                "cluster reads are chosen from all of them, so an earlier output would depend "
                "on later tokens (Vyas et al. 2020 define the method for non-causal attention)"
            )
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        query_mask = _query_mask(q, k, key_padding_mask)
        assignment = self._cluster(q, query_mask, self._current_draw())
        return self._attention(q, k, v, assignment, key_padding_mask, query_mask, reference=False)

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        query_mask = _query_mask(q, k, key_padding_mask)
        assignment = self._cluster(q, query_mask, 0)
        return self._attention(q, k, v, assignment, key_padding_mask, query_mask, reference=True)

    def _attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        assignment: Tensor,
        key_padding_mask: Tensor | None,
        query_mask: Tensor | None,
        *,
        reference: bool,
    ) -> Tensor:
        fast, dense = self._paths
        return (dense if reference else fast)(
            q,
            k,
            v,
            assignment,
            num_clusters=self.num_clusters,
            key_padding_mask=key_padding_mask,
            query_padding_mask=query_mask,
            scale=self.scale,
            **self._path_options(),
        )

    def _path_options(self) -> dict[str, Any]:
        """The options of the attention function beyond those of plain clustered attention."""
        return {}

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"num_clusters={self.num_clusters}, iterations={self.iterations}, "
            f"bits={self.bits}, hash_bias={self.hash_bias}, seed={self.seed}, scale={self.scale}"
        )


class ImprovedClusteredAttention(ClusteredAttention):
    """Improved clustered attention (Vyas et al. 2020, §3.3): the queries are clustered as
    in :class:`ClusteredAttention`; each cluster's ``topk`` keys of largest centroid weight
    are read by each query of the cluster with its own softmax over them, scaled by the
    centroid's total weight on them, and the other keys with the centroid's weights
    (:func:`kattn.functional.improved_clustered_attention`). O(L·(C + topk)·D) time and
    memory; exact when ``topk >= Lk``.

    Defaults as :class:`ClusteredAttention` and ``topk=32`` (the paper's §4 and the released
    code). Randomness, padding, cross-attention and the missing causal form as there.

    Args:
        topk: keys each cluster reads exactly, a positive int; other options as
            :class:`ClusteredAttention`.
    """

    _paths = (improved_clustered_attention, improved_clustered_attention_reference)

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        num_clusters: int = 100,
        iterations: int = 10,
        bits: int = 63,
        hash_bias: bool = True,
        topk: int = 32,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            max_len=max_len,
            num_clusters=num_clusters,
            iterations=iterations,
            bits=bits,
            hash_bias=hash_bias,
            seed=seed,
            scale=scale,
        )
        self._check_option_types(topk=topk)
        self.topk = positive_int("topk", topk)

    def _path_options(self) -> dict[str, Any]:
        return {"topk": self.topk}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, topk={self.topk}"


def _query_mask(q: Tensor, k: Tensor, key_padding_mask: Tensor | None) -> Tensor | None:
    """The padded queries: in self-attention (Lq == Lk) those of the padded keys."""
    return key_padding_mask if q.shape[2] == k.shape[2] else None


_REFERENCE = (
    "Vyas, Katharopoulos, Fleuret, Fast Transformers with Clustered Attention, NeurIPS 2020"
)

register_mechanism(
    "clustered",
    ClusteredAttention,
    summary="Queries hashed and grouped by k-means in Hamming space; each cluster's centroid "
    "attends with softmax and its queries share the output.",
    reference=_REFERENCE,
    complexity="O(L·C·D) time and memory (C = num_clusters; hashing and k-means O(L·C·R), "
    "R = bits)",
    approximates="softmax",
    size_option="num_clusters",
    colour="#fdae6b",
)

register_mechanism(
    "improved_clustered",
    ImprovedClusteredAttention,
    summary="Clustered attention whose queries also read their cluster's top-k keys exactly, "
    "scaled by the centroid's mass on them.",
    reference=_REFERENCE,
    complexity="O(L·(C + K)·D) time and memory (C = num_clusters, K = topk; hashing and "
    "k-means O(L·C·R), R = bits)",
    approximates="softmax",
    size_option="num_clusters",
    colour="#fd8d3c",
)
