"""The chunked pass of Reformer LSH attention (Kitaev, Kaiser and Levskaya, "Reformer: The
Efficient Transformer", ICLR 2020, §2 and App. A): which key slot each query slot of a sorted
chunk may read (:func:`chunk_mask`), and the softmax of each chunk over [previous chunk, own
chunk] gathered straight from the unsorted q, k, v with a recomputing backward
(:class:`ChunkAttention` on a :class:`ChunkPlan`). Used by
:func:`kattn.functional.reformer_attention`.

Shapes: B batch, H heads, L length, D head dim, Dv value dim, R rounds, m the chunk length,
nc = ⌈L/m⌉ chunks per round, Lp = nc·m.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .lsh import slots

__all__ = ["ChunkAttention", "ChunkPlan", "causal_key_ranges", "causal_layout", "chunk_mask"]

#: score elements computed at once (the chunks are processed in groups of about this size).
_CHUNK_ELEMENTS = 1 << 20

#: the logit of a disallowed key: exp(−1e30 − max) is 0 in fp32 and fp64.
_MASKED = -1e30


class ChunkPlan:
    """Row indices for :class:`ChunkAttention`, per (b, h, round), ``(B·H·R, ·)``: the rows
    of q of each block of ``m`` query slots (filler slots read row 0 and are masked), the
    rows of k and v of each block's window of ``span`` key chunks, and the output rows of
    the queries (a filler slot sees no key and is not written).

    ``order_q`` ``(B, H, R, NB·m)`` holds the query position of each slot of the NB blocks,
    ``order_k`` ``(B, H, R, Lp)`` the key sorted order, ``allowed`` the ``(…, m, span·m)``
    masks of the blocks and ``starts`` ``(B, H, R, NB)`` the first key chunk of each block's
    window counted from ``span − 1`` front filler chunks (default: block n reads key chunks
    n − span + 1 … n)."""

    def __init__(
        self,
        order_q: Tensor,
        order_k: Tensor,
        allowed: Tensor,
        length: int,
        m: int,
        scale: float,
        starts: Tensor | None = None,
    ) -> None:
        b, h, rounds, lq = order_q.shape
        nblocks, span = lq // m, allowed.shape[-1] // m
        device = order_q.device
        bh = torch.arange(b * h, device=device).view(b, h, 1, 1)
        r = torch.arange(rounds, device=device).view(1, 1, rounds, 1)
        front = order_k.new_zeros(b, h, rounds, (span - 1) * m)
        back = order_k.new_zeros(b, h, rounds, m)  # a window may end one chunk past Lp
        keys = (torch.cat([front, order_k, back], dim=-1) + bh * length).view(b * h * rounds, -1)
        if starts is None:
            starts = torch.arange(nblocks, device=device).expand(b, h, rounds, nblocks)
        window = torch.arange(span * m, device=device)
        index = (starts.reshape(-1, nblocks, 1) * m + window).view(keys.shape[0], -1)
        self.rows_q = (order_q + bh * length).view(-1, lq)
        self.rows_k = keys.gather(1, index)  # (N, NB·span·m)
        self.rows_out = (order_q + (bh * rounds + r) * length).view(-1, lq)
        self.allowed = allowed.reshape(-1, nblocks, m, span * m)
        self.shape, self.length, self.m, self.scale = (b, h, rounds), length, m, scale
        self.span = span
        per_chunk = self.rows_q.shape[0] * m * span * m
        step = max(1, _CHUNK_ELEMENTS // per_chunk)
        self.groups = [(c0, min(nblocks, c0 + step)) for c0 in range(0, nblocks, step)]

    def read(self, c0: int, c1: int) -> tuple[Tensor, Tensor, Tensor]:
        """Flat int64 rows of blocks c0..c1: the queries ``(N·c·m,)``, the keys of each
        block's window ``(N·c·span·m,)`` and the outputs ``(N·c·m,)``."""
        m, w = self.m, self.span * self.m
        return (
            self.rows_q[:, c0 * m : c1 * m].reshape(-1),
            self.rows_k[:, c0 * w : c1 * w].reshape(-1),
            self.rows_out[:, c0 * m : c1 * m].reshape(-1),
        )

    def gather(self, q: Tensor, k: Tensor, v: Tensor, c0: int, c1: int) -> tuple[Tensor, ...]:
        """Blocks c0..c1 as ``N·c`` batches: the scaled queries ``(·, m, D)``, their keys and
        values ``(·, span·m, ·)``, the mask ``(·, m, span·m)`` and the three row lists."""
        iq, ik, io = self.read(c0, c1)
        nc, m, w = self.rows_q.shape[0] * (c1 - c0), self.m, self.span * self.m
        qg = q.index_select(0, iq).view(nc, m, -1).mul_(self.scale)
        kw = k.index_select(0, ik).view(nc, w, -1)
        vw = v.index_select(0, ik).view(nc, w, -1)
        allowed = self.allowed[:, c0:c1].reshape(nc, m, w)
        return qg, kw, vw, allowed, iq, ik, io


class ChunkAttention(torch.autograd.Function):
    """Softmax attention of each sorted chunk over [previous chunk, own chunk], gathered
    group by group straight from the unsorted q, k, v and written back to the original
    positions: ``out (B, H, R, L, Dv)`` and ``lse (B, H, R, L)`` (−∞ and zeros for a query
    with no key). The backward recomputes each group's softmax and adds the gradients into
    the unsorted rows, so nothing of size R·L·m is kept and no sorted copy is made."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan) -> Any:
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
        plan: ChunkPlan = ctx.plan
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


def chunk_mask(
    order_q: Tensor,
    order_k: Tensor,
    hashes_q: Tensor,
    hashes_k: Tensor,
    pad: Tensor,
    m: int,
    across: bool,
) -> Tensor:
    """``(B, H, R·nc, m, 2m)`` bool, True where query slot s may read the key slot of
    ``[previous chunk, own chunk]`` (the non-causal form): not itself, the same bucket (unless
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
        cq = at(slots(order_q, length) // m, order_q).view(b, h, rounds, rounds, nc, m, 1)
        ck = at(slots(order_k, length) // m, order_k).view(b, h, rounds, rounds, nc, m)
        ck = torch.cat([ck.roll(1, dims=4), ck], dim=-1)[..., None, :]
        for r in range(1, rounds):  # drop what rounds 0 … r − 1 already hold
            for e in range(r):
                ci, cj = cq[:, :, e, r], ck[:, :, e, r]  # the chunks in round e
                held = (cj <= ci) & (cj >= ci - 1)
                if not across:
                    held &= bq[:, :, e, r] == bk[:, :, e, r]
                allowed[:, :, r] &= ~held
    return allowed.view(b, h, rounds * nc, m, 2 * m)


def causal_key_ranges(
    order_k: Tensor, hashes_q: Tensor, hashes_k: Tensor, pad: Tensor, window: int
) -> tuple[Tensor, Tensor]:
    """The causal form's keys of each query position i, round by round: the key slots
    ``[lo_i, hi_i)`` of the sorted order, ``hi_i`` the slot where (bucket h(q_i), position i)
    would be inserted among the real keys (so the slots before it in its bucket are exactly
    the keys ``j < i`` of that bucket) and ``lo_i = max(first slot of the bucket, hi_i −
    window)``: the ``window`` most recent earlier keys of the bucket. ``(B, H, R, L)`` each."""
    length = hashes_k.shape[-1]
    pos = torch.arange(length, device=hashes_k.device)
    top = int(torch.maximum(hashes_q.max(), hashes_k.max())) + 1 if hashes_k.numel() else 1
    key = torch.where(pad[:, None, None, :], top, hashes_k) * length + pos
    ordered = key.gather(-1, order_k[..., :length]).contiguous()  # ascending: real keys first
    hi = torch.searchsorted(ordered, (hashes_q * length + pos).contiguous())
    first = torch.searchsorted(ordered, (hashes_q * length).contiguous())
    return torch.maximum(first, hi - window), hi


def causal_layout(
    order_q: Tensor, order_k: Tensor, hashes_q: Tensor, hashes_k: Tensor, pad: Tensor, m: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The blocks of the causal form (window ``W = 2m − 1`` key slots): ``(query positions
    (B, H, R, NB·m), starts (B, H, R, NB), allowed (B, H, R, NB, m, 3m))`` for
    :class:`ChunkPlan` with a window of three key chunks.

    The real queries, in (bucket, position) order, have nondecreasing ``hi``; those with
    ``⌊hi/m⌋ = g`` need only key chunks g − 2 … g (``hi − W ≥ (g − 2)·m + 1``), so each
    such group is cut into blocks of m and its blocks read those three chunks. With shared
    QK, ``hi`` is the query's own slot and the blocks are the chunks of the sorted order;
    otherwise there are at most ``⌈L/m⌉ + nc + 1`` blocks. Padded queries read nothing.
    Keys held by an earlier round are dropped (each key counts once)."""
    b, h, rounds, length = hashes_q.shape
    nc = -(-length // m)
    lo, hi = causal_key_ranges(order_k, hashes_q, hashes_k, pad, 2 * m - 1)
    oq = order_q[..., :length]
    real = ~pad[:, None, None, :].expand(b, h, rounds, length).gather(-1, oq)
    group = torch.where(real, hi.gather(-1, oq) // m, nc + 1)  # nondecreasing; padding last
    counts = torch.zeros(b, h, rounds, nc + 2, dtype=torch.long, device=oq.device)
    counts.scatter_add_(-1, group, torch.ones_like(group))
    blocks = (counts + m - 1) // m
    blocks[..., -1] = 0  # the padded queries' group has no block
    nblocks = max(1, int(blocks.sum(-1).max()))
    rank = torch.arange(length, device=oq.device) - (counts.cumsum(-1) - counts).gather(-1, group)
    block = torch.where(real, (blocks.cumsum(-1) - blocks).gather(-1, group) + rank // m, nblocks)
    dest = torch.where(real, block * m + rank % m, nblocks * m)  # the last slot: a bin
    slots_shape = (b, h, rounds, nblocks * m + 1)
    qpos = oq.new_zeros(slots_shape).scatter_(-1, dest, oq)[..., :-1]
    valid = real.new_zeros(slots_shape).scatter_(-1, dest, real)[..., :-1]
    starts = group.new_zeros(b, h, rounds, nblocks + 1).scatter_(-1, block, group)[..., :-1]
    t = (starts[..., None] - 2) * m + torch.arange(3 * m, device=oq.device)  # (…, NB, 3m)
    lo_q = lo.gather(-1, qpos).view(b, h, rounds, nblocks, m, 1)
    hi_q = hi.gather(-1, qpos).view(b, h, rounds, nblocks, m, 1)
    allowed = (t[..., None, :] >= lo_q) & (t[..., None, :] < hi_q)
    allowed &= valid.view(b, h, rounds, nblocks, m, 1)
    if rounds > 1:
        keys = torch.cat([order_k.new_zeros(b, h, rounds, 2 * m), order_k], dim=-1)
        keys = torch.cat([keys, order_k.new_zeros(b, h, rounds, m)], dim=-1)
        kpos = keys.gather(-1, (t + 2 * m).clamp_max(keys.shape[-1] - 1).flatten(-2))
        ks = slots(order_k, length)
        for r in range(1, rounds):  # drop what rounds 0 … r − 1 already hold
            qr, kr = qpos[:, :, r], kpos[:, :, r]
            for e in range(r):
                ke = ks[:, :, e].gather(-1, kr).view(b, h, nblocks, 1, 3 * m)
                le = lo[:, :, e].gather(-1, qr).view(b, h, nblocks, m, 1)
                he = hi[:, :, e].gather(-1, qr).view(b, h, nblocks, m, 1)
                allowed[:, :, r] &= ~((ke >= le) & (ke < he))
    return qpos, starts, allowed
