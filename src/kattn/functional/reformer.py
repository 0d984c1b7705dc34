"""LSH attention of the Reformer (Kitaev, Kaiser and Levskaya, "Reformer: The Efficient
Transformer", ICLR 2020, §2 and App. A).

Angular LSH (§2, after Andoni et al. 2015): with a random ``(D, nb/2)`` matrix R per round,
``h(x) = argmax([xR; −xR])`` puts x in one of ``nb`` buckets. Each round r sorts the tokens by
(bucket, position), cuts the sorted order into chunks of ``m = bucket_size`` positions, and
query i may read the keys of its own chunk and of the chunk before it (the paper's
``P̃_i = {j : ⌊s_i/m⌋ − 1 ≤ ⌊s_j/m⌋ ≤ ⌊s_i/m⌋}``, s the sorted slot), i.e. ``P_i^(r)``:

- ``attend_across_buckets=True`` (trax's LSHSelfAttention, HF ``transformers``,
  reformer-pytorch's default): every key of those chunks counts; False: only keys of query
  i's bucket (the paper's ``P_i = {j : h(q_i) = h(k_j)}`` intersected with the chunks);
- causal: only ``j ≤ i`` (original positions);
- never i itself (``j ≠ i``, §2 "Causal masking for shared-QK attention"), except that a
  token whose pattern is empty in every round reads its own value alone (the first token of a
  causal sequence);
- positions marked by ``key_padding_mask`` are sorted after every real position (as if in a
  last bucket of their own, as HF does), so that the real tokens' chunks do not depend on
  them, and they count nowhere.

The rounds are combined as one softmax over the union ``P_i = ∪_r P_i^(r)`` in which a key
found in several rounds counts once: the paper's multi-round correction (§2, App. A)
subtracts ``log N_ij``, ``N_ij = |{r : j ∈ P_i^(r)}|``, from the logits of each round and
weights the rounds by ``exp(lse_r − lse)``; the fast path instead drops from round r the keys
that an earlier round already holds, which makes the rounds disjoint parts of the same union
(the same result).
reformer-pytorch counts such a key once per round by default (``allow_duplicate_attention``),
and it and trax let the first chunk of a round look back into the last chunk of the previous
round (their chunks roll over the concatenated rounds); here the first chunk of each round
reads only itself, as the definition above says.

No number of buckets is a parameter: ``nb = 2·⌈L/m⌉``, from the paper's ``m = 2l/n_buckets``
(average bucket ``m/2``, so that a bucket rarely outgrows two chunks); HF rounds the same ratio
down to a power of two, reformer-pytorch uses ``L/bucket_size`` buckets.

With ``shared_qk=True`` (the paper's Shared-QK Transformer) the keys are ``q_j/‖q_j‖`` and
queries and keys share one sorted order; with ``shared_qk=False`` (kattn's extension) q and k
are hashed with the same rotations and sorted separately, and query chunk n reads key chunks
n − 1 and n.

Causal caveat (as in the paper and trax): no query reads a later key or value, but which
earlier keys land in its chunks depends on every token's bucket, later ones included.

Shapes: B batch, H heads, L length, D head dim, Dv value dim, R rounds, nb buckets, m the
chunk length, nc = ⌈L/m⌉ chunks per round.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..checks import positive_int
from .numerics import accumulation_dtype, autocast_off

#: projections ``xR`` computed at once (positions are hashed in slices of this many).
_HASH_ELEMENTS = 1 << 21

__all__ = [
    "lsh_buckets",
    "reformer_attention",
    "reformer_attention_reference",
    "reformer_num_buckets",
]


def reformer_num_buckets(length: int, bucket_size: int) -> int:
    """``nb = 2·⌈L/m⌉`` buckets for L tokens and chunks of ``m = bucket_size`` (the paper's
    ``m = 2l/n_buckets``, rounded up to whole chunks; at least 2)."""
    return 2 * -(-positive_int("length", length) // positive_int("bucket_size", bucket_size))


def lsh_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH, ``h(x) = argmax([xR; −xR])`` (Kitaev et al. 2020, §2), for every round.

    Args:
        x: ``(B, H, L, D)``.
        rotations: ``(H or 1, D, R, nb/2)`` random projections, one set per head and round.

    Returns:
        ``(B, H, R, L)`` int64 buckets in ``[0, nb)``, computed in fp32 (fp64 for fp64 x).
    """
    if (
        rotations.ndim != 4
        or rotations.shape[0] not in (1, x.shape[1])
        or rotations.shape[1] != x.shape[-1]
    ):
        raise ValueError(
            f"rotations must be (H or 1, D, R, nb/2) with H = {x.shape[1]}, D = {x.shape[-1]}, "
            "got shape "
            f"{tuple(rotations.shape)}"
        )
    acc = accumulation_dtype(x.dtype)
    b, h, length, _ = x.shape
    half = rotations.shape[-1]
    buckets = torch.empty(b, h, rotations.shape[2], length, dtype=torch.long, device=x.device)
    step = max(1, _HASH_ELEMENTS // max(1, b * h * rotations.shape[2] * half))
    with autocast_off(x), torch.no_grad():
        rot = rotations.to(device=x.device, dtype=acc)
        for start in range(0, length, step):  # xR a slice of positions at a time
            xs = x[:, :, start : start + step].to(acc)
            proj = torch.einsum("bhld,hdrn->bhrln", xs, rot)
            top, arg_top = proj.max(dim=-1)
            low, arg_low = proj.min(dim=-1)
            # argmax([xR; −xR]): the first maximum, a tie going to xR
            buckets[..., start : start + step] = torch.where(top >= -low, arg_top, arg_low + half)
    return buckets


def reformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotations: Tensor,
    *,
    bucket_size: int = 64,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    shared_qk: bool = True,
    attend_across_buckets: bool = True,
    scale: float | None = None,
) -> Tensor:
    """Multi-round LSH attention (module docstring), in O(R·(L·log L + L·nb·D +
    L·m·(D + Dv))) time and O(R·L·(m + Dv)) memory (a bool per score, the rounds' outputs).

    Per round: hash, argsort by bucket and position (padded positions last), and attend from
    each chunk of the sorted order to ``[previous chunk, own chunk]``: the rows are gathered
    a group of chunks at a time straight from q, k and v (no sorted copies), the per-token
    rules are one bool mask built from the sorted positions, and each output row is written
    back to its original position; the backward recomputes each group's softmax and adds the
    gradients into the unsorted rows. The rounds are merged by their log-sum-exp.

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)`` (not read when ``shared_qk``);
            v: ``(B, H, L, Dv)``.
        rotations: ``(H or 1, D, R, nb/2)``, the random projections of the R rounds.
        bucket_size: m, positions per chunk of the sorted order.
        causal: keys ``j ≤ i`` only.
        key_padding_mask: ``(B, L)`` bool, True marks padding.
        shared_qk: keys are ``q/‖q‖`` (k is not read) when True.
        attend_across_buckets: whether keys of another bucket in the two chunks count.
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q.
    """
    m, across = positive_int("bucket_size", bucket_size), attend_across_buckets
    b, _, length, d = q.shape
    if k.shape[:3] != q.shape[:3] or v.shape[:3] != q.shape[:3] or k.shape[-1] != d:
        raise ValueError(
            "reformer_attention needs q, k (B, H, L, D) and v (B, H, L, Dv) of one length, got "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    pad = _padding(key_padding_mask, b, length, q.device)
    if q.numel() == 0 or v.numel() == 0:  # nothing to sort: the empty output, in the graph
        return (q[..., :1] + k[..., :1]) * v * 0
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    with autocast_off(q):
        hashes_q = lsh_buckets(q, rotations)  # (B, H, R, L)
        hashes_k = hashes_q if shared_qk else lsh_buckets(k, rotations)
        lp = -(-length // m) * m  # whole chunks
        order_q = _sorted_order(hashes_q, pad, lp)  # (B, H, R, Lp), filler slots: 0
        order_k = order_q if shared_qk else _sorted_order(hashes_k, pad, lp)
        if bool(pad.any()):  # padded rows become zeros, so no NaN stored there gets through
            k, v = (x.masked_fill(pad[:, None, :, None], 0.0) for x in (k, v))
        allowed = _chunk_mask(order_q, order_k, hashes_q, hashes_k, pad, m, causal, across)
        plan = _ChunkPlan(order_q, order_k, allowed, length, m, scale)
        out_r, lse_r = _ChunkAttention.apply(  # (B, H, R, L, Dv), (B, H, R, L)
            q.to(acc), _unit(q.to(acc)) if shared_qk else k.to(acc), v.to(acc), plan
        )
        top = lse_r.detach().amax(dim=2, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)
        weights = torch.exp(lse_r - top)  # the rounds' weights exp(lse_r − lse), 0 if empty
        total = weights.sum(dim=2, keepdim=True)
        weights = weights / torch.where(total > 0, total, 1.0)
        out = (out_r * weights[..., None]).sum(dim=2)  # (B, H, L, Dv)
        empty = (total.squeeze(2) == 0).nonzero(as_tuple=True)
        if empty[0].numel():  # no round reads a key (e.g. the first causal token): own value
            out = out.index_put_(empty, v[empty].to(out.dtype))
    return out.to(q.dtype)


def reformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotations: Tensor,
    *,
    bucket_size: int = 64,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    shared_qk: bool = True,
    attend_across_buckets: bool = True,
    scale: float | None = None,
) -> Tensor:
    """The same attention (same arguments, same hashes) from the definition, in O(R·L²)
    time and memory: each round's sorted slot of position i counted as the number of tokens
    before it in (padding, bucket, position) order, its dense ``(L, L)`` pattern ``P^(r)``,
    ``N_ij`` the number of rounds holding (i, j), one masked softmax per round of the logits
    minus ``log N_ij`` (the paper's App. A), the rounds weighted by ``exp(lse_r − lse)``, and
    ``v_i`` itself where no round holds a key."""
    m = positive_int("bucket_size", bucket_size)
    b, _, length, d = q.shape
    pad = _padding(key_padding_mask, b, length, q.device)
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    q_, k_, v_ = q.to(acc), k.to(acc), v.to(acc).masked_fill(pad[:, None, :, None], 0.0)
    if shared_qk:
        k_ = _unit(q_)
    k_ = k_.masked_fill(pad[:, None, :, None], 0.0)
    hq = lsh_buckets(q, rotations)
    hk = hq if shared_qk else lsh_buckets(k, rotations)
    cq = _dense_rank(hq, pad) // m  # (B, H, R, L): the chunk of each query, each round
    ck = _dense_rank(hk, pad) // m
    i = torch.arange(length, device=q.device)
    ci, cj = cq[..., :, None], ck[..., None, :]
    held = (cj <= ci) & (cj >= ci - 1)  # (B, H, R, L, L)
    if not attend_across_buckets:
        held &= hq[..., :, None] == hk[..., None, :]
    rule = (i[None, :] != i[:, None]) & ~pad[:, None, None, None, :]
    if causal:
        rule &= i[None, :] <= i[:, None]
    held &= rule
    count = held.sum(dim=2, keepdim=True)  # N_ij
    logits = torch.einsum("bhid,bhjd->bhij", q_, k_)[:, :, None] * scale
    logits = logits - torch.log(count.clamp_min(1).to(acc))
    logits = logits.masked_fill(~held, -math.inf)
    lse = torch.logsumexp(logits, dim=-1)  # (B, H, R, L)
    total = torch.logsumexp(lse, dim=2, keepdim=True)
    finite = torch.isfinite(total)
    weights = torch.exp(logits - torch.where(finite, total, 0.0)[..., None])
    out = torch.einsum("bhrij,bhjd->bhid", weights.nan_to_num(0.0), v_)
    out = torch.where(finite.squeeze(2)[..., None], out, v_)
    return out.to(q.dtype)


# ------------------------------------------------------------------------------- helpers
def _padding(key_padding_mask: Tensor | None, b: int, length: int, device: torch.device) -> Tensor:
    if key_padding_mask is None:
        return torch.zeros(b, length, dtype=torch.bool, device=device)
    if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (b, length):
        raise ValueError(
            f"key_padding_mask must be a (B, L) = {(b, length)} bool tensor, got shape "
            f"{tuple(key_padding_mask.shape)} and dtype {key_padding_mask.dtype}"
        )
    return key_padding_mask


def _unit(x: Tensor) -> Tensor:
    """``x/‖x‖`` over the last dim (a zero vector stays zero)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def _sorted_order(hashes: Tensor, pad: Tensor, lp: int) -> Tensor:
    """The positions of each round in (bucket, position) order with the padded positions
    last (in position order), ``(B, H, R, Lp)``,
    followed by ``Lp − L`` filler slots holding 0 (masked as padding wherever they are read)."""
    b, h, rounds, length = hashes.shape
    nb_top = int(hashes.max()) + 1 if hashes.numel() else 1
    bucket = torch.where(pad[:, None, None, :], nb_top, hashes)  # padding: a last bucket
    key = bucket * length + torch.arange(length, device=hashes.device)
    order = key.argsort(dim=-1)
    filler = order.new_zeros(b, h, rounds, lp - length)
    return torch.cat([order, filler], dim=-1)


def _slots(order: Tensor, length: int) -> Tensor:
    """The inverse of :func:`_sorted_order`: the sorted slot of each position, (B, H, R, L)."""
    slots = torch.empty_like(order[..., :length])
    ranks = torch.arange(length, device=order.device).expand_as(slots)
    return slots.scatter_(-1, order[..., :length], ranks)


#: score elements computed at once (the chunks are processed in groups of about this size).
_CHUNK_ELEMENTS = 1 << 20

#: the logit of a disallowed key: exp(−1e30 − max) is 0 in fp32 and fp64.
_MASKED = -1e30


class _ChunkPlan:
    """Row indices for :class:`_ChunkAttention`, per (b, h, round), ``(B·H·R, ·)``: the rows
    of q in sorted order (filler slots read row 0 and are masked), the rows of k and v of
    ``m`` front filler slots (chunk 0's missing previous chunk) then the sorted order, and
    the output rows of the sorted queries (a filler slot sees no key and is not written)."""

    def __init__(
        self, order_q: Tensor, order_k: Tensor, allowed: Tensor, length: int, m: int, scale: float
    ) -> None:
        b, h, rounds, lp = order_q.shape
        bh = torch.arange(b * h, device=order_q.device).view(b, h, 1, 1)
        r = torch.arange(rounds, device=order_q.device).view(1, 1, rounds, 1)
        front = order_k.new_zeros(b, h, rounds, m)
        self.rows_q = (order_q + bh * length).view(-1, lp)
        self.rows_k = (torch.cat([front, order_k], dim=-1) + bh * length).view(-1, m + lp)
        self.rows_out = (order_q + (bh * rounds + r) * length).view(-1, lp)
        self.allowed = allowed.view(-1, lp // m, m, 2 * m)
        self.shape, self.length, self.m, self.scale = (b, h, rounds), length, m, scale
        per_chunk = self.rows_q.shape[0] * m * 2 * m
        step = max(1, _CHUNK_ELEMENTS // per_chunk)
        self.groups = [(c0, min(lp // m, c0 + step)) for c0 in range(0, lp // m, step)]

    def read(self, c0: int, c1: int) -> tuple[Tensor, Tensor, Tensor]:
        """Flat int64 rows of chunks c0..c1: the queries ``(N·c·m,)``, the keys of each
        chunk's window of two blocks ``(N·c·2m,)`` and the outputs ``(N·c·m,)``."""
        m = self.m
        windows = self.rows_k[:, c0 * m : (c1 + 1) * m].unfold(1, 2 * m, m)  # (N, c, 2m)
        return (
            self.rows_q[:, c0 * m : c1 * m].reshape(-1),
            windows.reshape(-1),
            self.rows_out[:, c0 * m : c1 * m].reshape(-1),
        )

    def gather(self, q: Tensor, k: Tensor, v: Tensor, c0: int, c1: int) -> tuple[Tensor, ...]:
        """Chunks c0..c1 as ``N·c`` batches: the scaled queries ``(·, m, D)``, their keys and
        values ``(·, 2m, ·)``, the mask ``(·, m, 2m)`` and the three row index lists."""
        iq, ik, io = self.read(c0, c1)
        nc, m = self.rows_q.shape[0] * (c1 - c0), self.m
        qg = q.index_select(0, iq).view(nc, m, -1).mul_(self.scale)
        kw = k.index_select(0, ik).view(nc, 2 * m, -1)
        vw = v.index_select(0, ik).view(nc, 2 * m, -1)
        allowed = self.allowed[:, c0:c1].reshape(nc, m, 2 * m)
        return qg, kw, vw, allowed, iq, ik, io


class _ChunkAttention(torch.autograd.Function):
    """Softmax attention of each sorted chunk over [previous chunk, own chunk], gathered
    group by group straight from the unsorted q, k, v and written back to the original
    positions: ``out (B, H, R, L, Dv)`` and ``lse (B, H, R, L)`` (−∞ and zeros for a query
    with no key). The backward recomputes each group's softmax and adds the gradients into
    the unsorted rows, so nothing of size R·L·m is kept and no sorted copy is made."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, plan: _ChunkPlan) -> Any:
        (b, h, rounds), length = plan.shape, plan.length
        n, d, dv = b * h * rounds, q.shape[-1], v.shape[-1]
        qf, kf, vf = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, dv)
        out = q.new_zeros(n * length, dv)
        lse = q.new_full((n * length,), -math.inf)
        for c0, c1 in plan.groups:
            qg, kw, vw, allowed, _, _, io = plan.gather(qf, kf, vf, c0, c1)
            scores = torch.bmm(qg, kw.transpose(1, 2)).masked_fill_(~allowed, _MASKED)
            seen = allowed.any(dim=-1)
            lse_c = torch.logsumexp(scores, dim=-1).masked_fill_(~seen, -math.inf)
            p = torch.exp(scores.sub_(lse_c.nan_to_num(neginf=0.0)[..., None]))
            o = torch.bmm(p.mul_(seen[..., None]), vw)
            keep = seen.flatten()  # filler queries see nothing: only real rows are written
            out.index_copy_(0, io[keep], o.reshape(-1, dv)[keep])
            lse.index_copy_(0, io[keep], lse_c.flatten()[keep])
        out, lse = out.view(b, h, rounds, length, dv), lse.view(b, h, rounds, length)
        ctx.save_for_backward(q, k, v, out)
        ctx.plan = plan
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor, d_lse: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out = ctx.saved_tensors
        plan: _ChunkPlan = ctx.plan
        d, dv = q.shape[-1], v.shape[-1]
        qf, kf, vf = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, dv)
        dof = d_out.reshape(-1, dv)
        # rowsum(dO ∘ O) − dlse; a query with no key has O = 0 and counts nowhere
        delta = ((d_out * out).sum(dim=-1) - d_lse.nan_to_num(0.0)).flatten()
        dq, dk, dvf = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        for c0, c1 in plan.groups:
            qg, kw, vw, allowed, iq, ik, io = plan.gather(qf, kf, vf, c0, c1)
            scores = torch.bmm(qg, kw.transpose(1, 2)).masked_fill_(~allowed, _MASKED)
            p = torch.softmax(scores, dim=-1).mul_(allowed.any(dim=-1, keepdim=True))
            doc = dof.index_select(0, io).view(p.shape[0], p.shape[1], dv)
            ds = torch.bmm(doc, vw.transpose(1, 2))
            ds.sub_(delta.index_select(0, io).view(*p.shape[:2], 1)).mul_(p)
            dq.index_add_(0, iq, torch.bmm(ds, kw).view(-1, d), alpha=plan.scale)
            dk.index_add_(0, ik, torch.bmm(ds.transpose(1, 2), qg).view(-1, d))
            dvf.index_add_(0, ik, torch.bmm(p.transpose(1, 2), doc).view(-1, dv))
        return dq.view_as(q), dk.view_as(k), dvf.view_as(v), None


def _chunk_mask(
    order_q: Tensor,
    order_k: Tensor,
    hashes_q: Tensor,
    hashes_k: Tensor,
    pad: Tensor,
    m: int,
    causal: bool,
    across: bool,
) -> Tensor:
    """``(B, H, R·nc, m, 2m)`` bool, True where query slot s may read the key slot of
    ``[previous chunk, own chunk]``: not itself, not later (causal), the same bucket (unless
    ``across``) held by no earlier round (each key counts once), and neither a padded key nor
    a filler slot."""
    b, h, rounds, lp = order_q.shape
    length = hashes_q.shape[-1]
    nc = lp // m
    qpos = order_q.view(b, h, rounds, nc, m, 1)
    kpos = order_k.view(b, h, rounds, nc, m)
    kwin = torch.cat([kpos.roll(1, dims=3), kpos], dim=-1)[..., None, :]  # (…, nc, 1, 2m)
    key_pad = pad[:, None, None, :].expand(b, h, rounds, length).gather(3, order_k)
    key_pad[..., length:] = True  # the filler slots
    key_pad = key_pad.view(b, h, rounds, nc, m)
    allowed = (kwin != qpos) & ~torch.cat([key_pad.roll(1, dims=3), key_pad], dim=-1)[..., None, :]
    if causal:
        allowed &= kwin <= qpos
    allowed[:, :, :, 0, :, :m] = False  # chunk 0 of a round has no previous chunk
    allowed.view(b, h, rounds, lp, 2 * m)[:, :, :, length:] = False  # filler queries

    def at(table: Tensor, pos: Tensor) -> Tensor:  # table (B, H, R, L) read at positions
        return table.gather(-1, pos.reshape(b, h, 1, -1).expand(-1, -1, table.shape[2], -1))

    if not across:
        bq = at(hashes_q, order_q).view(b, h, rounds, rounds, nc, m, 1)
        bk = at(hashes_k, order_k).view(b, h, rounds, rounds, nc, m)
        bk = torch.cat([bk.roll(1, dims=4), bk], dim=-1)[..., None, :]
        for r in range(rounds):
            allowed[:, :, r] &= bq[:, :, r, r] == bk[:, :, r, r]
    if rounds > 1:
        cq = at(_slots(order_q, length) // m, order_q).view(b, h, rounds, rounds, nc, m, 1)
        ck = at(_slots(order_k, length) // m, order_k).view(b, h, rounds, rounds, nc, m)
        ck = torch.cat([ck.roll(1, dims=4), ck], dim=-1)[..., None, :]
        for r in range(1, rounds):  # drop what rounds 0 … r − 1 already hold
            for e in range(r):
                ci, cj = cq[:, :, e, r], ck[:, :, e, r]  # the chunks in round e
                held = (cj <= ci) & (cj >= ci - 1)
                if not across:
                    held &= bq[:, :, e, r] == bk[:, :, e, r]
                allowed[:, :, r] &= ~held
    return allowed.view(b, h, rounds * nc, m, 2 * m)


def _dense_rank(hashes: Tensor, pad: Tensor) -> Tensor:
    """Round by round, the number of positions before i in (padding, bucket, position) order
    (padded positions in position order, their buckets unused), counted pair by pair:
    ``(B, H, R, L)``. O(R·L²): for the reference."""
    length = hashes.shape[-1]
    padded = pad[:, None, None, :].expand_as(hashes)
    hashes = hashes.masked_fill(padded, 0)
    i = torch.arange(length, device=hashes.device)
    pi, pj = padded[..., :, None], padded[..., None, :]
    hi, hj = hashes[..., :, None], hashes[..., None, :]
    before = (pj < pi) | ((pj == pi) & ((hj < hi) | ((hj == hi) & (i[None, :] < i[:, None]))))
    return before.sum(dim=-1)
