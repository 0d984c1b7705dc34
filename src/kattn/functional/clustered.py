"""Clustered attention (Vyas, Katharopoulos, Fleuret, Fast Transformers with Clustered
Attention, NeurIPS 2020, §3.2–3.3): the queries are grouped into C clusters and attention is
computed once per cluster.

- Clustering (§3.2): each query is hashed by ``bits`` random hyperplanes (with a random
  offset, so that Hamming distance follows Euclidean distance) and the codes are clustered
  by a few Lloyd iterations of k-means in Hamming space (majority vote per bit).
- Clustered attention (§3.2, eq. 5–6): the centroid ``Q^c_j`` is the mean of the queries of
  cluster j, ``A^c = softmax(Q^c Kᵀ · scale)``, and every query of cluster j gets
  ``(A^c V)_j``. O(L·C·D) time and memory.
- Improved clustered attention (§3.3, eq. 10–11): ``T_j`` holds the ``topk`` keys with the
  largest centroid weights of cluster j and ``m̂_j = Σ_{l ∈ T_j} A^c_jl`` their mass; query i
  of cluster j reads the keys of ``T_j`` with its own weights, scaled by ``m̂_j``,
  ``A^t_il = m̂_j softmax_{l ∈ T_j}(q_i·k_l · scale)``, and the other keys with its
  centroid's weights ``A^c_jl``. O(L·(C + topk)·D) time and memory.

The assignment of queries to clusters is an input of the attention functions (no gradient
flows through it, as in the released code), and each has a dense ``*_reference`` that forms
the full ``(Lq, Lk)`` weight matrix of the same clustering. Padded keys count nowhere; padded
queries (``query_padding_mask``) neither vote in k-means nor enter a centroid mean.

Shapes: B batch, H heads, Lq/Lk query/key lengths, D query/key dim, Dv value dim, C clusters,
K = ``topk``, R = ``bits``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype, autocast_off, zero_padded
from .sparse_gather import MASKED, gathered_softmax_attention

__all__ = [
    "cluster_centroids",
    "cluster_queries",
    "clustered_attention",
    "clustered_attention_reference",
    "hamming_kmeans",
    "hash_queries",
    "improved_clustered_attention",
    "improved_clustered_attention_reference",
]

#: gathered key elements per chunk of queries in the top-k part of the improved form.
_CHUNK_ELEMENTS = 1 << 22


# ------------------------------------------------------------------------------ clustering
def hash_queries(q: Tensor, planes: Tensor) -> Tensor:
    """Hyperplane codes of the queries: bit r of query i is ``q_i·a_r > b_r``, where
    ``planes[r] = (a_r, b_r)`` is ``(D + 1,)`` (a zero offset b gives the cosine hash).

    Args:
        q: ``(B, H, Lq, D)``; planes: ``(R, D + 1)``.

    Returns:
        ``(B, H, Lq, R)`` codes in ±1 (float32, or float64 for float64 q), so that
        ``R − codes_i·codes_j = 2·Hamming(i, j)``.
    """
    acc = accumulation_dtype(q.dtype)
    with autocast_off(q):
        planes = planes.to(device=q.device, dtype=acc)
        proj = q.detach().to(acc) @ planes[:, :-1].T  # (B, H, Lq, R)
        return torch.where(proj > planes[:, -1], 1.0, -1.0).to(acc)


def hamming_kmeans(
    codes: Tensor,
    init: Tensor,
    spare: Tensor,
    *,
    iterations: int,
    valid: Tensor | None = None,
) -> Tensor:
    """Lloyd's k-means in Hamming space (Vyas et al. 2020, §3.2), as the released code runs
    it: ``iterations`` assignments to the nearest centroid (first one on ties) with a
    centroid update between consecutive ones, each centroid bit the majority bit of its
    members (0 on a tie); a centroid left without members is replaced by a spare code.

    Args:
        codes: ``(B, H, Lq, R)`` ±1 codes (:func:`hash_queries`).
        init: ``(B, H, C, R)`` ±1 initial centroids.
        spare: ±1 codes broadcastable to ``(iterations − 1, B, H, C, R)``: the code that
            update t gives to an empty cluster.
        iterations: assignments, at least 1.
        valid: ``(B, Lq)`` bool, False for padded queries: they are assigned (to their
            nearest centroid) but never vote.

    Returns:
        ``(B, H, Lq)`` int64 cluster indices in ``[0, C)``.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    weight = codes.new_ones((*codes.shape[:3], 1))
    if valid is not None:
        weight = valid[:, None, :, None].to(codes.dtype).expand_as(weight)
    spare = spare.to(codes.dtype).expand((iterations - 1, *init.shape))
    centroids = init.to(codes.dtype)
    for t in range(iterations - 1):
        nearest = (codes @ centroids.transpose(-1, -2)).argmax(dim=-1)  # (B, H, Lq)
        index = nearest[..., None].expand_as(codes)
        votes = torch.zeros_like(centroids).scatter_add_(2, index, codes * weight)
        members = torch.zeros_like(centroids[..., :1]).scatter_add_(2, index[..., :1], weight)
        majority = torch.where(votes > 0, 1.0, -1.0).to(codes.dtype)
        centroids = torch.where(members > 0, majority, spare[t])
    return (codes @ centroids.transpose(-1, -2)).argmax(dim=-1)


def cluster_queries(
    q: Tensor,
    *,
    num_clusters: int,
    bits: int = 63,
    iterations: int = 10,
    hash_bias: bool = True,
    generator: torch.Generator | None = None,
    query_padding_mask: Tensor | None = None,
) -> Tensor:
    """Cluster the queries of each sequence and head (§3.2): hyperplane codes
    (:func:`hash_queries`), then :func:`hamming_kmeans` started from the codes of C
    distinct random queries (not padded ones).

    The random draws come from ``generator`` (on the CPU; torch's global RNG if None) in a
    fixed order, hyperplanes ``(R, D + 1)`` from N(0, 1), spare codes
    ``(iterations, H, C, R)``, then one priority per position ``(Lq,)``; every sequence of
    the batch uses the same draws, so its clustering does not depend on the others: its
    initial centroids are its C unpadded queries of lowest priority (a uniform random
    subset), and slots beyond its number of unpadded queries start from spare codes.

    Args:
        q: ``(B, H, Lq, D)``.
        num_clusters: C, at least 1.
        bits: R, at least 1.
        iterations: Lloyd assignments, at least 1.
        hash_bias: random hyperplane offsets (Hamming distance follows Euclidean distance);
            False: hyperplanes through the origin (it follows the angle).
        query_padding_mask: ``(B, Lq)`` bool, True marks padded queries.

    Returns:
        ``(B, H, Lq)`` int64 cluster indices in ``[0, C)``; not differentiable.
    """
    b, h, lq, d = q.shape
    c = positive_int("num_clusters", num_clusters)
    positive_int("bits", bits)
    positive_int("iterations", iterations)
    planes = torch.randn(bits, d + 1, generator=generator, dtype=torch.float64)
    if not hash_bias:
        planes[:, -1] = 0.0
    spare = torch.randint(0, 2, (iterations, h, c, bits), generator=generator) * 2 - 1
    priority = torch.rand(lq, generator=generator, dtype=torch.float64)
    codes = hash_queries(q, planes)
    spare = spare.to(device=q.device, dtype=codes.dtype)[:, None]  # (iterations, 1, H, C, R)
    valid = None if query_padding_mask is None else ~query_padding_mask
    rank = priority.to(q.device).expand(b, lq)
    if valid is not None:
        rank = torch.where(valid, rank, 2.0)  # padded queries come last
    first = rank.argsort(dim=-1)[:, :c]  # (B, min(C, Lq))
    init = codes.gather(2, first[:, None, :, None].expand(b, h, -1, bits))
    unpadded = lq if valid is None else valid.sum(dim=-1, keepdim=True)  # (B, 1)
    taken = torch.arange(first.shape[1], device=q.device).expand(b, -1) < unpadded
    init = torch.where(taken[:, None, :, None], init, spare[0, :, :, : first.shape[1]])
    init = torch.cat([init, spare[0, :, :, first.shape[1] :].expand(b, -1, -1, -1)], dim=2)
    return hamming_kmeans(codes, init, spare[1:], iterations=iterations, valid=valid)


def cluster_centroids(
    q: Tensor, assignment: Tensor, num_clusters: int, query_padding_mask: Tensor | None = None
) -> Tensor:
    """``(B, H, C, D)`` means of the unpadded queries of each cluster (zero for a cluster
    with none); differentiable in q. ``assignment``: ``(B, H, Lq)`` indices in ``[0, C)``."""
    b, h, _, d = q.shape
    weight = q.new_ones((*q.shape[:3], 1))
    if query_padding_mask is not None:
        keep = ~query_padding_mask[:, None, :, None]
        q, weight = q.masked_fill(~keep, 0.0), keep.to(q.dtype).expand_as(weight)
    index = assignment[..., None]
    sums = q.new_zeros(b, h, num_clusters, d).scatter_add(2, index.expand_as(q), q)
    counts = q.new_zeros(b, h, num_clusters, 1).scatter_add(2, index, weight)
    return sums / counts.clamp_min(1.0)


# ------------------------------------------------------------------------------- attention
def clustered_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    assignment: Tensor,
    *,
    num_clusters: int,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Clustered attention (§3.2): query i of cluster j gets ``softmax(Q^c_j Kᵀ · scale) V``,
    ``Q^c_j`` the mean of the cluster's unpadded queries. O(L·C·(D + Dv)) time and memory.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        assignment: ``(B, H, Lq)`` int64 clusters in ``[0, C)`` (:func:`cluster_queries`).
        num_clusters: C.
        key_padding_mask: ``(B, Lk)`` bool, True marks padded keys (zeroed, counted nowhere).
        query_padding_mask: ``(B, Lq)`` bool, True marks queries left out of the means.
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in q's dtype (sums in fp32 for half inputs); zeros for a query
        that sees no key.
    """
    with autocast_off(q):
        q_, k_, v_, scale = _prepared(q, k, v, key_padding_mask, scale)
        centroids = cluster_centroids(q_, assignment, num_clusters, query_padding_mask)
        weights, _ = _centroid_weights(centroids, k_, key_padding_mask, scale)
        values = weights @ v_  # (B, H, C, Dv)
        return _broadcast(values, assignment).to(q.dtype)


def clustered_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    assignment: Tensor,
    *,
    num_clusters: int,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The dense form of :func:`clustered_attention` for the same clustering: the
    ``(C, Lq)`` membership matrix gives the centroids, and row i of the ``(Lq, Lk)`` weight
    matrix is the centroid weights of i's cluster (eq. 5–6). Same arguments."""
    q_, k_, v_, scale = _prepared(q, k, v, key_padding_mask, scale)
    centroids = _dense_centroids(q_, assignment, num_clusters, query_padding_mask)
    logits = centroids @ k_.transpose(-1, -2) * scale  # (B, H, C, Lk)
    centroid_weights = _dense_softmax(logits, _key_ok(k_, key_padding_mask))
    of_query = F.one_hot(assignment, num_clusters).to(q_.dtype)  # (B, H, Lq, C)
    weights = of_query @ centroid_weights  # (B, H, Lq, Lk)
    return (weights @ v_).to(q.dtype)


def improved_clustered_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    assignment: Tensor,
    *,
    num_clusters: int,
    topk: int,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Improved clustered attention (§3.3, eq. 10–11): query i of cluster j reads the
    ``topk`` keys ``T_j`` of largest centroid weight with its own softmax over them, times
    their centroid mass ``m̂_j``, and every other key with the centroid weight:
    ``out_i = m̂_j Σ_{l ∈ T_j} softmax_{T_j}(q_i·k_l · scale) v_l + Σ_{l ∉ T_j} A^c_jl v_l``.
    O(L·(C + K)·(D + Dv)) time and memory; the per-query part gathers the keys of ``T_j`` a
    chunk of queries at a time and recomputes its softmax in the backward. No gradient
    flows through the choice of ``T_j``; ``m̂_j`` and ``A^c`` are differentiable. With
    ``topk >= Lk`` this is exact softmax attention.

    Args: as :func:`clustered_attention`, and ``topk``: K, at least 1.
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    positive_int("topk", topk)
    with autocast_off(q):
        q_, k_, v_, scale = _prepared(q, k, v, key_padding_mask, scale)
        centroids = cluster_centroids(q_, assignment, num_clusters, query_padding_mask)
        weights, logits = _centroid_weights(centroids, k_, key_padding_mask, scale)
        top = logits.detach().topk(min(topk, lk), dim=-1).indices  # (B, H, C, K)
        kk = top.shape[-1]
        mass = weights.gather(-1, top).sum(dim=-1, keepdim=True)  # (B, H, C, 1)
        rest = weights.scatter(-1, top, 0.0) @ v_  # (B, H, C, Dv)
        keys = top.gather(2, assignment[..., None].expand(b, h, lq, kk))  # (B, H, Lq, K)
        rows = torch.arange(b * h, device=q.device).view(b, h, 1, 1) * lk
        key_ok = None if key_padding_mask is None else ~key_padding_mask

        def chunk(c0: int, c1: int) -> tuple[Tensor, Tensor]:
            kc = keys[:, :, c0:c1]
            if key_ok is None:
                allowed = torch.ones((), dtype=torch.bool, device=q.device)
            else:
                flat_keys = kc.reshape(b, h * (c1 - c0) * kk)
                allowed = key_ok.gather(1, flat_keys).view(b, h, c1 - c0, 1, kk)
            return (rows + kc).reshape(-1), allowed.expand(b, h, c1 - c0, 1, kk)

        step = max(1, _CHUNK_ELEMENTS // max(1, b * h * kk * max(d, dv)))
        chunks = [(c0, min(lq, c0 + step)) for c0 in range(0, lq, step)]
        qb = (q_ * scale)[:, :, :, None, :]  # (B, H, Lq, 1, D)
        kb, vb = k_.reshape(b * h * lk, 1, d), v_.reshape(b * h * lk, 1, dv)
        own, _ = gathered_softmax_attention(qb, kb, vb, chunks, chunk, kk, False)
        out = _broadcast(mass, assignment) * own[:, :, :, 0] + _broadcast(rest, assignment)
        return out.to(q.dtype)


def improved_clustered_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    assignment: Tensor,
    *,
    num_clusters: int,
    topk: int,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The dense form of :func:`improved_clustered_attention` for the same clustering, eq.
    10–11 with full matrices: ``T_jl`` is true when fewer than ``topk`` unpadded keys have a
    larger centroid logit than key l, and the ``(Lq, Lk)`` weights are
    ``m̂_j softmax_{T_j}(q_i·k_l · scale)`` on ``T_j`` and ``A^c_jl`` elsewhere."""
    q_, k_, v_, scale = _prepared(q, k, v, key_padding_mask, scale)
    centroids = _dense_centroids(q_, assignment, num_clusters, query_padding_mask)
    logits = centroids @ k_.transpose(-1, -2) * scale  # (B, H, C, Lk)
    key_ok = _key_ok(k_, key_padding_mask)  # (B, 1, 1, Lk)
    centroid_weights = _dense_softmax(logits, key_ok)
    larger = (logits[..., None, :] > logits[..., :, None]) & key_ok[..., None, :]
    in_top = (larger.sum(dim=-1) < topk) & key_ok  # (B, H, C, Lk)
    mass = (centroid_weights * in_top).sum(dim=-1, keepdim=True)  # (B, H, C, 1)
    of_query = F.one_hot(assignment, num_clusters).to(q_.dtype)  # (B, H, Lq, C)
    top_q = (of_query @ in_top.to(q_.dtype)) > 0  # (B, H, Lq, Lk)
    own = _dense_softmax(q_ @ k_.transpose(-1, -2) * scale, top_q)
    weights = (of_query @ mass) * own + of_query @ (centroid_weights * ~in_top)
    return (weights @ v_).to(q.dtype)


# --------------------------------------------------------------------------------- helpers
def _prepared(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, scale: float | None
) -> tuple[Tensor, Tensor, Tensor, float]:
    """q, k, v in the accumulation dtype with padded keys and values zeroed (so a NaN stored
    there reaches nothing through 0 × NaN), and the logit scale."""
    acc = accumulation_dtype(q.dtype)
    k, v = zero_padded(key_padding_mask, k.to(acc), v.to(acc))
    return q.to(acc), k, v, q.shape[-1] ** -0.5 if scale is None else scale


def _centroid_weights(
    centroids: Tensor, k: Tensor, key_padding_mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """``A^c (B, H, C, Lk)`` (zero rows when every key is padded) and the masked logits."""
    logits = centroids @ k.transpose(-1, -2) * scale
    if key_padding_mask is None:
        return torch.softmax(logits, dim=-1), logits
    pad = key_padding_mask[:, None, None, :]
    logits = logits.masked_fill(pad, MASKED)
    seen = ~key_padding_mask.all(dim=-1)[:, None, None, None]
    return torch.softmax(logits, dim=-1) * seen, logits


def _broadcast(per_cluster: Tensor, assignment: Tensor) -> Tensor:
    """Row ``assignment[b, h, i]`` of ``per_cluster (B, H, C, E)`` for every query i."""
    index = assignment[..., None].expand(-1, -1, -1, per_cluster.shape[-1])
    return per_cluster.gather(2, index)


def _dense_centroids(
    q: Tensor, assignment: Tensor, num_clusters: int, query_padding_mask: Tensor | None
) -> Tensor:
    """``(B, H, C, D)`` centroids through the ``(B, H, C, Lq)`` membership matrix of the
    unpadded queries (padded ones are zeroed first, so a NaN stored there stays out)."""
    member = F.one_hot(assignment, num_clusters).transpose(-1, -2).to(q.dtype)
    if query_padding_mask is not None:
        member = member * ~query_padding_mask[:, None, None, :]
        q = q.masked_fill(query_padding_mask[:, None, :, None], 0.0)
    return member @ q / member.sum(dim=-1, keepdim=True).clamp_min(1.0)


def _key_ok(k: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """``(B, 1, 1, Lk)`` bool, True on unpadded keys."""
    if key_padding_mask is None:
        return torch.ones(1, 1, 1, k.shape[2], dtype=torch.bool, device=k.device)
    return ~key_padding_mask[:, None, None, :]


def _dense_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last dim restricted to ``allowed``; rows with nothing allowed are 0."""
    logits = logits.masked_fill(~allowed, float("-inf"))
    top = logits.detach().amax(dim=-1, keepdim=True)
    weights = torch.exp(logits - torch.where(torch.isfinite(top), top, 0.0))
    den = weights.sum(dim=-1, keepdim=True)
    return weights / torch.where(den > 0, den, 1.0)
