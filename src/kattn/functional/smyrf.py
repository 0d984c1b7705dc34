"""SMYRF attention (Daras, Kitaev, Odena, Dimakis, SMYRF: Efficient Attention using Asymmetric
Clustering, NeurIPS 2020, §3): softmax inside balanced clusters of queries and keys.

1. Asymmetric transform (XBOX+): with ``M_Q = max_i ‖q_i‖``, ``M_K = max_j ‖k_j‖`` and
   ``M² = M_Q² + M_K²``, ``F(q) = [q; √(M² − ‖q‖²); 0]`` and ``G(k) = [k; 0; √(M² − ‖k‖²)]``,
   so that ``‖F(q) − G(k)‖² = 2M² − 2 q·k``: the nearest transformed key is the key of the
   largest inner product (maximum inner product search becomes nearest-neighbour search).
2. Hashing: each of R rounds projects the transformed vectors on one Gaussian direction a_r
   (E2LSH, ``h(x) = (a·x + b)/w``; the released code sorts by the unrounded value, so the
   offset b and the width w do not change anything and only ``a·x`` is kept).
3. Balanced clusters: queries sorted by hash are cut into C clusters of consecutive ranks,
   keys likewise, and query cluster c attends to key cluster c. With n items, cluster c holds
   the ranks ``[⌊c·n/C⌋, ⌊(c+1)·n/C⌋)`` (sizes differ by at most one); a key cluster that would
   be empty (``0 < n_keys < C``) holds the one key of rank ``⌊c·n/C⌋``.
4. Rounds are merged by their softmax normalisers (log-sum-exp), as in Reformer; this is
   softmax with each pair weighted by the number N_ij of rounds that put i and j together:
   ``out_i = Σ_j N_ij e^{s_ij} v_j / Σ_j N_ij e^{s_ij}`` (:func:`smyrf_attention_reference`).

``C_b = ⌈max(nq_b, nk_b) / cluster_size⌉`` for an example of nq_b real queries and nk_b
real keys (at least 1), so an example's clusters, and its output, do not depend on how much
padding its batch adds: with Lq == Lk both sides have clusters of about ``cluster_size``; in
cross-attention the shorter side has smaller clusters, so each round costs
``C · ⌈nq/C⌉ · ⌈nk/C⌉ ≈ min(nq, nk) · cluster_size`` scores.

Padding: padded keys get no rank (they sort after the real ones and are left out of the
clusters, which are cut from the real keys only); with Lq == Lk (self-attention) the mask
marks padded queries too, which are left out of M_Q and of the query clusters and get a zero
output. M_Q and M_K are maxima over the real rows of each example and head.

Shapes: B batch, H heads, Lq/Lk lengths, D head dim, Dv value dim, R rounds, C clusters.
"""

from __future__ import annotations

import math
from typing import NamedTuple, overload

import torch
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype

__all__ = [
    "SmyrfOrders",
    "smyrf_attention",
    "smyrf_attention_reference",
    "smyrf_num_clusters",
    "smyrf_orders",
    "smyrf_pattern",
    "smyrf_transform",
]


class SmyrfOrders(NamedTuple):
    """The hash orders of one call.

    Attributes:
        q_order: ``(B, H, R, Lq)`` int64, query positions sorted by hash (padded ones last).
        k_order: ``(B, H, R, Lk)`` int64, key positions sorted by hash (padded ones last).
        num_queries: ``(B,)`` int64, the real queries of each example.
        num_keys: ``(B,)`` int64, the real keys of each example.
    """

    q_order: Tensor
    k_order: Tensor
    num_queries: Tensor
    num_keys: Tensor


@overload
def smyrf_num_clusters(lq: int, lk: int, cluster_size: int) -> int: ...


@overload
def smyrf_num_clusters(lq: Tensor, lk: Tensor, cluster_size: int) -> Tensor: ...


def smyrf_num_clusters(lq: int | Tensor, lk: int | Tensor, cluster_size: int) -> int | Tensor:
    """C = ⌈max(nq, nk) / cluster_size⌉ (at least 1), the clusters of each round for nq
    queries and nk keys: ints, or the ``(B,)`` real counts of each example
    (``SmyrfOrders.num_queries``, ``num_keys``) for a ``(B,)`` tensor."""
    positive_int("cluster_size", cluster_size)
    if isinstance(lq, Tensor) or isinstance(lk, Tensor):
        longest = torch.maximum(torch.as_tensor(lq), torch.as_tensor(lk))
        return torch.div(longest + cluster_size - 1, cluster_size, rounding_mode="floor").clamp(
            min=1
        )
    return max(1, -(-max(lq, lk) // cluster_size))


def _padding(q: Tensor, k: Tensor, key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Bool ``(B, Lq)`` and ``(B, Lk)``: True on padded queries (self-attention) and keys."""
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    pad_k = torch.zeros(b, lk, dtype=torch.bool, device=k.device)
    if key_padding_mask is not None:
        pad_k = key_padding_mask.to(k.device)
    pad_q = pad_k if lq == lk else torch.zeros(b, lq, dtype=torch.bool, device=q.device)
    return pad_q, pad_k


def smyrf_transform(
    q: Tensor, k: Tensor, *, key_padding_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """XBOX+ (Daras et al. 2020 §3): ``F(q) = [q; √(M² − ‖q‖²); 0]``,
    ``G(k) = [k; 0; √(M² − ‖k‖²)]``, ``M² = M_Q² + M_K²`` with the maximum norms taken over
    the real rows of each example and head; padded rows are zero vectors.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding (padded queries too if
            Lq == Lk).

    Returns:
        ``F(q)`` ``(B, H, Lq, D + 2)`` and ``G(k)`` ``(B, H, Lk, D + 2)`` in the
        accumulation dtype.
    """
    acc = accumulation_dtype(q.dtype)
    pad_q, pad_k = _padding(q, k, key_padding_mask)
    xq = q.to(acc).masked_fill(pad_q[:, None, :, None], 0.0)
    xk = k.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    sq_q, sq_k = xq.square().sum(-1, keepdim=True), xk.square().sum(-1, keepdim=True)
    big = sq_q.amax(2, keepdim=True) + sq_k.amax(2, keepdim=True)  # M², (B, H, 1, 1)
    ext_q = (big - sq_q).clamp_min(0.0).sqrt().masked_fill(pad_q[:, None, :, None], 0.0)
    ext_k = (big - sq_k).clamp_min(0.0).sqrt().masked_fill(pad_k[:, None, :, None], 0.0)
    fq = torch.cat([xq, ext_q, torch.zeros_like(ext_q)], dim=-1)
    gk = torch.cat([xk, torch.zeros_like(ext_k), ext_k], dim=-1)
    return fq, gk


def smyrf_orders(
    q: Tensor, k: Tensor, projections: Tensor, *, key_padding_mask: Tensor | None = None
) -> SmyrfOrders:
    """Sort queries and keys by ``a_r · F(q)`` and ``a_r · G(k)`` for each round r.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``.
        projections: ``(R, D + 2)``, one Gaussian direction per round.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.

    Returns:
        :class:`SmyrfOrders` (padded rows sorted last, ties broken by position).
    """
    d = q.shape[-1]
    if projections.dim() != 2 or projections.shape[1] != d + 2:
        raise ValueError(
            f"projections must be (R, D + 2) = (R, {d + 2}), got {tuple(projections.shape)}"
        )
    with torch.no_grad():
        fq, gk = smyrf_transform(q, k, key_padding_mask=key_padding_mask)
        a = projections.to(device=fq.device, dtype=fq.dtype)
        hq = torch.einsum("bhle,re->bhrl", fq, a)  # (B, H, R, Lq)
        hk = torch.einsum("bhle,re->bhrl", gk, a)  # (B, H, R, Lk)
        pad_q, pad_k = _padding(q, k, key_padding_mask)
        hq = hq.masked_fill(pad_q[:, None, None, :], math.inf)
        hk = hk.masked_fill(pad_k[:, None, None, :], math.inf)
        q_order = torch.sort(hq, dim=-1, stable=True).indices
        k_order = torch.sort(hk, dim=-1, stable=True).indices
    return SmyrfOrders(q_order, k_order, (~pad_q).sum(-1), (~pad_k).sum(-1))


def _starts(cluster: Tensor, n: Tensor, num_clusters: int | Tensor) -> Tensor:
    """⌊c·n/C⌋, the first rank of cluster c among n items (n broadcast against c)."""
    return torch.div(cluster * n, num_clusters, rounding_mode="floor")


def _key_span(cluster: Tensor, n: Tensor, num_clusters: int | Tensor) -> tuple[Tensor, Tensor]:
    """The key ranks ``[start, end)`` of cluster c: ⌊c·n/C⌋ … ⌊(c+1)·n/C⌋, at least one key
    when n > 0."""
    start = _starts(cluster, n, num_clusters)
    end = _starts(cluster + 1, n, num_clusters)
    return start, torch.maximum(end, torch.minimum(start + 1, n))


def _query_cluster(rank: Tensor, n: Tensor, num_clusters: int | Tensor) -> Tensor:
    """The cluster of the query of rank r < n: the c with ⌊c·n/C⌋ <= r < ⌊(c+1)·n/C⌋."""
    return torch.div((rank + 1) * num_clusters - 1, n.clamp_min(1), rounding_mode="floor")


def _inverse(order: Tensor) -> Tensor:
    """The rank of each position: the inverse permutation along the last dim."""
    ar = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ar)


def smyrf_pattern(orders: SmyrfOrders, num_clusters: int | Tensor) -> Tensor:
    """The bool ``(B, H, R, Lq, Lk)`` pattern of each round: True where query i and key j are
    in clusters of the same rank, for ``num_clusters`` clusters (an int, or ``(B,)`` per
    example as :func:`smyrf_num_clusters` of the real counts gives). O(R·Lq·Lk) memory: for
    references and plots."""
    b = orders.num_queries.shape[0]
    nq = orders.num_queries.view(b, 1, 1, 1)
    nk = orders.num_keys.view(b, 1, 1, 1)
    if isinstance(num_clusters, Tensor):
        num_clusters = num_clusters.to(nq.device).view(b, 1, 1, 1)
    rank_q, rank_k = _inverse(orders.q_order), _inverse(orders.k_order)
    cluster = _query_cluster(rank_q, nq, num_clusters)  # (B, H, R, Lq)
    start, end = _key_span(cluster, nk, num_clusters)
    rk = rank_k[..., None, :]  # (B, H, R, 1, Lk)
    allowed = (rk >= start[..., None]) & (rk < end[..., None]) & (rk < nk[..., None])
    return allowed & (rank_q < nq)[..., None]


def smyrf_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projections: Tensor,
    *,
    cluster_size: int,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """SMYRF attention (see the module docstring): for each of the R rounds, softmax of the
    queries of each balanced cluster over the keys of the cluster of the same rank, the rounds
    merged by log-sum-exp. O(R·(L log L + min(Lq, Lk)·cluster_size·(D + Dv))) time and
    O(R·min(Lq, Lk)·cluster_size) memory, no (Lq, Lk) tensor.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        projections: ``(R, D + 2)`` hash directions.
        cluster_size: C_b = ⌈max(nq_b, nk_b)/cluster_size⌉ clusters per round for an
            example of nq_b real queries and nk_b real keys.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of v; zero rows for padded queries and for queries
        with no real key.
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    acc = accumulation_dtype(v.dtype)
    scale = d**-0.5 if scale is None else scale
    orders = smyrf_orders(q, k, projections, key_padding_mask=key_padding_mask)
    r = orders.q_order.shape[2]
    num_clusters = smyrf_num_clusters(orders.num_queries, orders.num_keys, cluster_size)
    nc, wq, wk = _window_sizes(orders, num_clusters, cluster_size, key_padding_mask is None)
    pad_q, pad_k = _padding(q, k, key_padding_mask)
    xq = q.to(acc).masked_fill(pad_q[:, None, :, None], 0.0) * scale
    xk = k.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    xv = v.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    clusters = torch.arange(nc, device=q.device)
    nq = orders.num_queries.view(b, 1)
    nk = orders.num_keys.view(b, 1)
    nc_b = num_clusters.view(b, 1)
    # the ranks held by the window of each cluster: (B, C, w), slots past the cluster invalid;
    # an example's clusters past its own C_b hold no real query and read no key
    q_rank = _starts(clusters, nq, nc_b)[..., None] + torch.arange(wq, device=q.device)
    k_start, k_end = _key_span(clusters, nk, nc_b)
    k_rank = k_start[..., None] + torch.arange(wk, device=q.device)
    k_valid = (k_rank < k_end[..., None]) & (k_rank < nk[..., None])
    qs = _gather_windows(xq, orders.q_order, q_rank.clamp(max=lq - 1))  # (B, H, R, C, wq, D)
    k_pos = _window_positions(orders.k_order, k_rank.clamp(max=lk - 1))
    ks, vs = _gather_rows(xk, k_pos), _gather_rows(xv, k_pos)  # (B, H, R, C, wk, ·)
    shape = (b, h, r, nc, wk)
    ks, vs = ks.view(*shape, d), vs.view(*shape, dv)
    scores = torch.einsum("bhrcid,bhrcjd->bhrcij", qs, ks)  # (B, H, R, C, wq, wk)
    scores = scores.masked_fill(~k_valid[:, None, None, :, None, :], -math.inf)
    out_c, lse_c = _softmax_with_lse(scores, vs)  # (B, H, R, C, wq, Dv), (B, H, R, C, wq)
    # back to query positions: the rank of query i, its cluster and its slot there
    rank = _inverse(orders.q_order)  # (B, H, R, Lq)
    nq4, nc4 = orders.num_queries.view(b, 1, 1, 1), num_clusters.view(b, 1, 1, 1)
    cluster = _query_cluster(rank, nq4, nc4)
    real = rank < nq4
    slot = torch.where(real, cluster * wq + rank - _starts(cluster, nq4, nc4), 0)
    out_r = out_c.reshape(b, h, r, nc * wq, dv).gather(
        3, slot[..., None].expand(-1, -1, -1, -1, dv)
    )
    lse_r = lse_c.reshape(b, h, r, nc * wq).gather(3, slot).masked_fill(~real, -math.inf)
    return _merge_rounds(out_r, lse_r).to(v.dtype)


def _window_sizes(
    orders: SmyrfOrders, num_clusters: Tensor, cluster_size: int, unpadded: bool
) -> tuple[int, int, int]:
    """The most clusters of any example and the most queries and keys in any of their
    clusters, ⌈n/C_b⌉ (a key window has at least one slot). Read from the device only with a
    padding mask, where the counts differ between examples."""
    lq, lk = orders.q_order.shape[-1], orders.k_order.shape[-1]
    if unpadded or orders.num_queries.numel() == 0:
        nc = smyrf_num_clusters(lq, lk, cluster_size)
        return nc, -(-lq // nc), max(1, -(-lk // nc))
    nq, nk = orders.num_queries, orders.num_keys
    sizes = torch.stack([num_clusters, -(-nq // num_clusters), -(-nk // num_clusters)])
    nc, wq, wk = sizes.amax(1).tolist()
    return nc, wq, max(1, wk)


def _window_positions(order: Tensor, rank: Tensor) -> Tensor:
    """Positions ``(B, H, R, C·w)`` of the ranks ``(B, C, w)`` in each round's order."""
    b, h, r, _ = order.shape
    n = rank.shape[1] * rank.shape[2]
    flat = rank.reshape(b, 1, 1, n).expand(b, h, r, n)
    return order.gather(3, flat)


def _gather_rows(x: Tensor, pos: Tensor) -> Tensor:
    """Rows of x ``(B, H, L, E)`` at positions ``(B, H, R, N)``: ``(B, H, R, N, E)``."""
    b, h, r, n = pos.shape
    e = x.shape[-1]
    rows = x.gather(2, pos.reshape(b, h, r * n, 1).expand(b, h, r * n, e))
    return rows.view(b, h, r, n, e)


def _gather_windows(x: Tensor, order: Tensor, rank: Tensor) -> Tensor:
    """The rows of x in each cluster window: ``(B, H, R, C, w, E)``."""
    b, h, r, _ = order.shape
    rows = _gather_rows(x, _window_positions(order, rank))
    return rows.view(b, h, r, rank.shape[1], rank.shape[2], x.shape[-1])


def _softmax_with_lse(scores: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax over the last dim of ``scores`` (−∞ where masked) applied to v, and its
    log-normaliser; a row with no allowed entry gives 0 and −∞ (finite gradients)."""
    m = scores.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    z = p.sum(-1)
    some = z > 0
    z_safe = torch.where(some, z, torch.ones_like(z))
    out = (p @ v) / z_safe[..., None]
    lse = torch.where(some, torch.log(z_safe) + m.squeeze(-1), -math.inf)
    return out, lse


def _merge_rounds(out: Tensor, lse: Tensor) -> Tensor:
    """``Σ_r e^{lse_r} out_r / Σ_r e^{lse_r}`` over dim 2: ``(B, H, R, Lq, Dv)`` and
    ``(B, H, R, Lq)`` to ``(B, H, Lq, Dv)``; 0 where every round is empty."""
    m = lse.detach().amax(2, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m)  # (B, H, R, Lq)
    den = w.sum(2)
    num = (w[..., None] * out).sum(2)
    return num / torch.where(den > 0, den, torch.ones_like(den))[..., None]


def smyrf_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    projections: Tensor,
    *,
    cluster_size: int,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The dense form of :func:`smyrf_attention` for the same projections:
    ``out_i = Σ_j N_ij e^{s_ij} v_j / Σ_j N_ij e^{s_ij}`` with ``s = scale·q·k`` and N_ij the
    number of rounds whose pattern (:func:`smyrf_pattern`) pairs query i with key j, which is
    the log-sum-exp merge of the per-round cluster softmaxes. O(R·Lq·Lk) memory.

    Args and returns as :func:`smyrf_attention`.
    """
    d = q.shape[-1]
    acc = accumulation_dtype(v.dtype)
    scale = d**-0.5 if scale is None else scale
    orders = smyrf_orders(q, k, projections, key_padding_mask=key_padding_mask)
    num_clusters = smyrf_num_clusters(orders.num_queries, orders.num_keys, cluster_size)
    counts = smyrf_pattern(orders, num_clusters).sum(2)
    pad_q, pad_k = _padding(q, k, key_padding_mask)
    xq = q.to(acc).masked_fill(pad_q[:, None, :, None], 0.0)
    xk = k.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    xv = v.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    scores = scale * xq @ xk.transpose(-1, -2)  # (B, H, Lq, Lk)
    logits = torch.where(counts > 0, scores + counts.to(acc).log(), -math.inf)
    out, _ = _softmax_with_lse(logits, xv)
    return out.to(v.dtype)
