"""The gather-and-softmax kernel under :func:`~kattn.functional.sparse.block_sparse_attention`,
with a backward that recomputes.

Forward, per chunk of query blocks: gather the key and value blocks of the table, one batched
matmul whose scores are masked in place, one softmax, one batched matmul. Nothing per chunk is
kept for the backward; it gathers the chunk again, recomputes the softmax ``P`` and forms

``dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O) + dlse)``, ``dQ = dS·K``, ``dK = dSᵀ·Q``, ``dV = Pᵀ·dO``

(the lse term is there when the caller uses the log-sum-exp, whose gradient with respect to
the scores is P). The key and value gradients of every chunk are added into one buffer with
``index_add_``. Letting autograd differentiate the gathers instead would allocate a zeroed
buffer of the whole key sequence for each chunk, O(L²) work in all, and keep every chunk's
scores alive until the backward, O(L·K·block) memory; here the memory held between forward
and backward is the inputs, the output and the lse, and the backward is linear in L like the
forward. Not twice differentiable.

Shapes: B batch, H heads, nQ query blocks of ``block`` positions, nK key blocks, K key blocks
per query block, D query/key dim, Dv value dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

#: the logit of a disallowed key: exp(−1e30 − max) is 0 in fp32 and fp64, with no −∞ − −∞.
MASKED = -1e30

#: ``chunk(c0, c1) → (flat, allowed)``: for query blocks c0..c1, the rows of the flattened
#: ``(B·H·nK, block, ·)`` keys to gather, ``(B·H·(c1 − c0)·K,)`` int64, and which gathered keys
#: each query may read, bool broadcastable to ``(B, H, c1 − c0, block, K·block)``.
ChunkFn = Callable[[int, int], tuple[Tensor, Tensor]]


def gathered_softmax_attention(
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    chunks: list[tuple[int, int]],
    chunk: ChunkFn,
    kmax: int,
    with_lse: bool,
) -> tuple[Tensor, Tensor]:
    """Masked softmax attention of the query blocks ``qb (B, H, nQ, block, D)`` (already
    multiplied by the logit scale) over the K key blocks that ``chunk`` names in
    ``kb (B·H·nK, block, D)`` and ``vb (B·H·nK, block, Dv)``, one chunk of query blocks at a
    time (``chunks``: the ``(c0, c1)`` ranges, covering ``[0, nQ)``).

    Returns ``out (B, H, nQ, block, Dv)`` (zeros on rows with nothing allowed) and, with
    ``with_lse``, the ``(B, H, nQ, block)`` log-sum-exp of the allowed logits (−∞ on such
    rows), else an empty tensor. Differentiable in qb, kb and vb (see the module docstring)."""
    out, lse = _GatheredSoftmax.apply(qb, kb, vb, chunks, chunk, kmax, with_lse)
    return out, lse


def _scores(qc: Tensor, kg: Tensor, allowed: Tensor) -> Tensor:
    """The chunk's logits with the disallowed entries set to :data:`MASKED` (in place: a NaN
    or inf score of a disallowed key is replaced too)."""
    return torch.matmul(qc, kg.transpose(-1, -2)).masked_fill_(~allowed, MASKED)


class _GatheredSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        qb: Tensor,
        kb: Tensor,
        vb: Tensor,
        chunks: list[tuple[int, int]],
        chunk: ChunkFn,
        kmax: int,
        with_lse: bool,
    ) -> tuple[Tensor, Tensor]:
        b, h, n_q, bs, d = qb.shape
        dv = vb.shape[-1]
        out = qb.new_empty(b, h, n_q, bs, dv)
        lse = qb.new_empty((b, h, n_q, bs) if with_lse else (0,))
        for c0, c1 in chunks:
            flat, allowed = chunk(c0, c1)
            kg = kb.index_select(0, flat).view(b, h, c1 - c0, kmax * bs, d)
            vg = vb.index_select(0, flat).view(b, h, c1 - c0, kmax * bs, dv)
            scores = _scores(qb[:, :, c0:c1], kg, allowed)
            seen = allowed.any(dim=-1, keepdim=True)
            out[:, :, c0:c1] = (torch.softmax(scores, dim=-1) @ vg).mul_(seen)
            if with_lse:
                lse_c = torch.logsumexp(scores, dim=-1).masked_fill_(~seen.squeeze(-1), -torch.inf)
                lse[:, :, c0:c1] = lse_c
        ctx.save_for_backward(qb, kb, vb, out)
        ctx.plan = (chunks, chunk, kmax, with_lse)
        if not with_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor, d_lse: Tensor) -> tuple[Tensor | None, ...]:
        qb, kb, vb, out = ctx.saved_tensors
        chunks, chunk, kmax, with_lse = ctx.plan
        b, h, _, bs, d = qb.shape
        dv = vb.shape[-1]
        dq, dk, dvb = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        delta = (d_out * out).sum(dim=-1, keepdim=True)  # rowsum(dO ∘ O)
        for c0, c1 in chunks:
            flat, allowed = chunk(c0, c1)
            kg = kb.index_select(0, flat).view(b, h, c1 - c0, kmax * bs, d)
            vg = vb.index_select(0, flat).view(b, h, c1 - c0, kmax * bs, dv)
            qc, doc = qb[:, :, c0:c1], d_out[:, :, c0:c1]
            seen = allowed.any(dim=-1, keepdim=True)
            p = torch.softmax(_scores(qc, kg, allowed), dim=-1).mul_(seen)  # empty rows: 0
            ds = torch.matmul(doc, vg.transpose(-1, -2)).sub_(delta[:, :, c0:c1])
            if with_lse:  # an empty row's lse is −∞: whatever its gradient, it counts nowhere
                ds.add_(d_lse[:, :, c0:c1, :, None].masked_fill(~seen, 0.0))
            ds.mul_(p)
            dq[:, :, c0:c1] = torch.matmul(ds, kg)
            dk.index_add_(0, flat, torch.matmul(ds.transpose(-1, -2), qc).view(-1, bs, d))
            dvb.index_add_(0, flat, torch.matmul(p.transpose(-1, -2), doc).view(-1, bs, dv))
        return dq, dk, dvb, None, None, None, None
