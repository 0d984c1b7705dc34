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

__all__ = ["ChunkAttention", "ChunkPlan", "chunk_mask"]

#: score elements computed at once (the chunks are processed in groups of about this size).
_CHUNK_ELEMENTS = 1 << 20

#: the logit of a disallowed key: exp(−1e30 − max) is 0 in fp32 and fp64.
_MASKED = -1e30


class ChunkPlan:
    """Row indices for :class:`ChunkAttention`, per (b, h, round), ``(B·H·R, ·)``: the rows
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
