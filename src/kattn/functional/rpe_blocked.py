"""Kernelized attention with relative positional weights, exact, in blocks of queries.

``z_i = Σ_j w_ij φ(q_i)·φ(k_j) v_j / Σ_j w_ij φ(q_i)·φ(k_j)`` with ``w_ij = exp(b_ij + s_j)``
(``b`` the encoding's log-coefficients, ``s`` the key log-scales). Each block of query rows
forms its ``(r, Lk)`` weights, shifted by their maximum per row over the keys the row sees
(the shift cancels in the ratio; every weight is <= 1), multiplies them into the kernel and
takes one matrix product with ``[v, 1]`` for numerator and normaliser together.

O(Lq·Lk·(M + Dv)) time, as two matrix products per block, and O(r·Lk) memory per (batch,
head) row: backward recomputes each block (as flash attention does) rather than keeping it.
Causal blocks stop at their last query's key (half the work). On the CPU this beats the FFT
of Algorithm 1 up to long sequences once ``M·Dv`` is large (the FFT transforms ``M·(Dv+1)``
channels at a fraction of the matrix-product rate); see docs/rpe.md.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .numerics import (
    DEFAULT_EPS,
    autocast_off,
    exp_floor,
    guard_normaliser,
    log_floor,
    prepare_linear_inputs,
)

#: default bound on the elements of one block's ``(B, H, r, Lk)`` weights (2^18: 1 MiB fp32,
#: cache-sized; larger blocks were slower on the 2-core CPU at L = 2048–4096).
DEFAULT_BLOCK_ELEMENTS = 1 << 18
#: fewest queries per block, above the element bound when B·H·Lk is large (thinner blocks
#: make thin matrix products: at L = 16384, 16 rows took 1.8× the time of 32).
MIN_BLOCK_ROWS = 32


class RowLogCoefficients:
    """The log-coefficients ``coeff`` of an encoding, cut into blocks of query rows.

    ``rows(i0, i1, kv)`` gives ``(H, i1 − i0, kv)``: queries i0..i1−1, keys 0..kv−1.
    Subclasses say how a block is cut from ``coeff`` (:meth:`block`, in reverse query order
    when ``reversed`` — what a view can give without a copy) and how its gradient goes back."""

    #: :meth:`block` lists the queries from i1−1 down to i0.
    reversed: bool = False

    def __init__(self, coeff: Tensor):
        self.coeff = coeff

    def __call__(self, i0: int, i1: int, kv: int) -> Tensor:
        block = self.block(self.coeff, i0, i1, kv)
        return block.flip(1) if self.reversed else block

    def block(self, coeff: Tensor, i0: int, i1: int, kv: int) -> Tensor:
        raise NotImplementedError

    def add_block_grad(self, grad_coeff: Tensor, grad: Tensor, i0: int, i1: int) -> None:
        """Add the gradient ``grad (H, r, kv)`` of a block (in :meth:`block`'s order) to
        ``grad_coeff`` in place."""
        raise NotImplementedError


class ToeplitzRows(RowLogCoefficients):
    """Rows of the Toeplitz matrix ``[b_{j−i}]`` of log-coefficients ``(H, Lq + Lk − 1)``
    (offsets ``−(Lq−1)…Lk−1``), cut from sliding windows of the coefficient vector."""

    reversed = True

    def __init__(self, coeff: Tensor, lq: int):
        super().__init__(coeff)
        self.lq = lq

    def _span(self, i0: int, i1: int, kv: int) -> slice:
        # query i needs b[t_i : t_i + kv] with t_i = lq − 1 − i: rows i0..i1−1 are the
        # windows of this span in reverse order
        return slice(self.lq - i1, self.lq - 1 - i0 + kv)

    def block(self, coeff: Tensor, i0: int, i1: int, kv: int) -> Tensor:
        return coeff[:, self._span(i0, i1, kv)].unfold(-1, kv, 1)  # a view, queries reversed

    def add_block_grad(self, grad_coeff: Tensor, grad: Tensor, i0: int, i1: int) -> None:
        kv = grad.shape[-1]
        span = self._span(i0, i1, kv)
        size = [grad.shape[0], span.stop - span.start]
        # the windows' gradient summed back onto the span: sums along the diagonals
        grad_coeff[:, span] += torch.ops.aten.unfold_backward(grad, size, 1, kv, 1)


class DenseRows(RowLogCoefficients):
    """Rows of a given ``(H, Lq, Lk)`` matrix of log-coefficients."""

    def block(self, coeff: Tensor, i0: int, i1: int, kv: int) -> Tensor:
        return coeff[:, i0:i1, :kv]

    def add_block_grad(self, grad_coeff: Tensor, grad: Tensor, i0: int, i1: int) -> None:
        grad_coeff[:, i0:i1, : grad.shape[-1]] += grad


def rpe_linear_attention_blocked(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    rows: RowLogCoefficients,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    max_block_elements: int = DEFAULT_BLOCK_ELEMENTS,
) -> Tensor:
    """Exact kernelized attention with positional weights, one block of queries at a time.

    Args:
        phi_q: ``(B, H, Lq, M)`` query features; phi_k: ``(B, H, Lk, M)`` key features, scaled
            by ``exp(k_log_scale)`` ``(B, H, Lk)`` if given; v: ``(B, H, Lk, Dv)``.
        rows: the log-coefficients, by blocks of queries (:class:`ToeplitzRows`,
            :class:`DenseRows`).
        causal: query i sees keys j <= i (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that must not count.
        eps: guard of the normaliser.
        max_block_elements: bound on the elements of one block's weights ``(B, H, r, Lk)``.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``; rows that see no key give 0.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    b, h, lq, m = fq.shape
    lk = fk.shape[2]
    if causal and lq != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
    dv = v32.shape[-1]
    n = b * h
    v_ext = torch.cat([v32, v32.new_ones(b, h, lk, 1)], dim=-1)  # the last column gives den
    log_s = s
    if key_padding_mask is not None:
        floor = torch.zeros((), dtype=fq.dtype, device=fq.device).fill_(log_floor(fq.dtype))
        pad = key_padding_mask[:, None, :].expand(b, h, lk)
        log_s = torch.where(pad, floor, fq.new_zeros(()) if log_s is None else log_s)
    # at least MIN_BLOCK_ROWS queries per block: many heads must not mean many tiny blocks
    r = max(1, min(lq, max(MIN_BLOCK_ROWS, max_block_elements // max(1, n * lk))))
    sums = _BlockedSums.apply(
        fq.reshape(n, lq, m),
        fk.reshape(n, lk, m),
        v_ext.reshape(n, lk, dv + 1),
        None if log_s is None else log_s.expand(b, h, lk).reshape(n, lk),
        rows.coeff,
        rows,
        causal,
        r,
        b,
    )
    sums = sums.view(b, h, lq, dv + 1)
    out = sums[..., :dv] / guard_normaliser(sums[..., dv:], eps)
    return out.to(v.dtype)


class _BlockedSums(torch.autograd.Function):
    """``[num, den]`` of every query, block by block; backward recomputes each block's
    kernel and accumulates the gradients in place (nothing of size Lq·Lk is kept).

    With ``K̃ = (Q Kᵀ) ⊙ W``, ``W = exp(log w − shift)`` and ``sums = K̃ [V, 1]``:
    ``dK̃ = G [V, 1]ᵀ``, ``d[V, 1] = K̃ᵀ G``, ``dQ = (dK̃ ⊙ W) K``, ``dK = (dK̃ ⊙ W)ᵀ Q`` and
    ``d log w = dK̃ ⊙ K̃`` (the shift cancels in the ratio and carries no gradient).
    Once differentiable."""

    @staticmethod
    def forward(
        ctx: Any,
        fq: Tensor,
        fk: Tensor,
        v_ext: Tensor,
        log_s: Tensor | None,
        coeff: Tensor,
        rows: RowLogCoefficients,
        causal: bool,
        r: int,
        b: int,
    ) -> Tensor:
        n, lq, _ = fq.shape
        sums = fq.new_empty(n, lq, v_ext.shape[-1])
        ws = _Workspace(fq, r * fk.shape[1], 2)
        for i0, i1, kv in _blocks(lq, fk.shape[1], r, causal):
            blk = _block_kernel(fq, fk, log_s, coeff, rows, causal, b, i0, i1, kv, ws)
            sums[:, i0:i1] = blk.in_query_order(torch.bmm(blk.kernel, v_ext[:, :kv]))
        ctx.save_for_backward(fq, fk, v_ext, log_s, coeff)
        ctx.rows, ctx.causal, ctx.r, ctx.b = rows, causal, r, b
        return sums

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        with autocast_off(grad):  # the products in the saved (fp32) dtype, as in forward
            return _BlockedSums._grads(ctx, grad)

    @staticmethod
    def _grads(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        fq, fk, v_ext, log_s, coeff = ctx.saved_tensors
        rows, causal, b = ctx.rows, ctx.causal, ctx.b
        need_q, need_k, need_v, need_s, need_c = ctx.needs_input_grad[:5]
        lq = fq.shape[1]
        grad = grad.contiguous()
        d_q = torch.zeros_like(fq) if need_q else None
        d_k = torch.zeros_like(fk) if need_k else None
        d_v = torch.zeros_like(v_ext) if need_v else None
        d_s = torch.zeros_like(log_s) if need_s else None
        # (accumulated in the inputs' dtype, fp32 for half-precision coefficients)
        d_c = torch.zeros_like(coeff, dtype=fq.dtype) if need_c else None
        ws = _Workspace(fq, ctx.r * fk.shape[1], 4)
        for i0, i1, kv in _blocks(lq, fk.shape[1], ctx.r, causal):
            blk = _block_kernel(fq, fk, log_s, coeff, rows, causal, b, i0, i1, kv, ws)
            g = blk.in_query_order(grad[:, i0:i1])  # (the block's own order: its own inverse)
            if d_v is not None:
                d_v[:, :kv].baddbmm_(blk.kernel.transpose(1, 2), g)
            d_kernel = torch.bmm(g, v_ext[:, :kv].transpose(1, 2), out=ws.take(2, blk.kernel))
            if d_s is not None or d_c is not None:
                d_log_w = torch.mul(d_kernel, blk.kernel, out=ws.take(3, blk.kernel))
                if d_s is not None:
                    d_s[:, :kv] += d_log_w.sum(dim=1)
                if d_c is not None:
                    heads = d_c.shape[0]  # (explicit: an empty batch leaves -1 undetermined)
                    rows.add_block_grad(d_c, d_log_w.view(b, heads, i1 - i0, kv).sum(0), i0, i1)
            d_scores = d_kernel.mul_(blk.weights)
            if blk.future is not None:
                d_scores.masked_fill_(blk.future, 0.0)
            if d_q is not None:
                d_q[:, i0:i1] = blk.in_query_order(torch.bmm(d_scores, fk[:, :kv]))
            if d_k is not None:
                d_k[:, :kv].baddbmm_(d_scores.transpose(1, 2), blk.queries)
        d_c = None if d_c is None else d_c.to(coeff.dtype)
        return d_q, d_k, d_v, d_s, d_c, None, None, None, None


def _blocks(lq: int, lk: int, r: int, causal: bool) -> list[tuple[int, int, int]]:
    """``(i0, i1, kv)``: each block's queries and how many keys it sees."""
    return [(i0, min(lq, i0 + r), min(lq, i0 + r) if causal else lk) for i0 in range(0, lq, r)]


class _Workspace:
    """Flat buffers reused by every block of a call: fresh multi-megabyte temporaries per
    block cost page faults that took about half the time at L = 16384."""

    def __init__(self, like: Tensor, elements: int, count: int):
        n = like.shape[0]
        self.buffers = [like.new_empty(n * elements) for _ in range(count)]

    def take(self, slot: int, like: Tensor) -> Tensor:
        return self.buffers[slot][: like.numel()].view(like.shape)

    def view(self, slot: int, *shape: int) -> Tensor:
        return self.buffers[slot][: math.prod(shape)].view(shape)


class _Block(NamedTuple):
    """One block's masked kernel ``(N, r, kv)``, its weights, the mask of future keys (None
    unless causal) and its queries ``(N, r, M)``, all in the order of the rows' block."""

    kernel: Tensor
    weights: Tensor
    future: Tensor | None
    queries: Tensor
    reversed: bool

    def in_query_order(self, x: Tensor) -> Tensor:
        """``x (N, r, ·)`` from the block's order to the queries' (or back)."""
        return x.flip(1) if self.reversed else x


def _block_kernel(
    fq: Tensor,
    fk: Tensor,
    log_s: Tensor | None,
    coeff: Tensor,
    rows: RowLogCoefficients,
    causal: bool,
    b: int,
    i0: int,
    i1: int,
    kv: int,
    ws: _Workspace,
) -> _Block:
    """The masked kernel ``(Q Kᵀ) ⊙ W`` of queries i0..i1−1 and keys 0..kv−1, with W each
    row's weights shifted by its maximum over the keys it sees, in workspace buffers 0 and 1
    (overwritten by the next block). No graph: every step writes in place."""
    dtype, r = fq.dtype, i1 - i0
    block = rows.block(coeff, i0, i1, kv).to(dtype)  # (H, r, kv), possibly a view of coeff
    queries = fq[:, i0:i1].flip(1) if rows.reversed else fq[:, i0:i1]
    log_w = ws.view(0, b, block.shape[0], r, kv)  # coeff itself is never written
    if log_s is None:
        log_w.copy_(block.expand_as(log_w))
    else:
        torch.add(block, log_s.view(b, block.shape[0], 1, log_s.shape[-1])[..., :kv], out=log_w)
    log_w = log_w.view(-1, r, kv)
    future = None
    if causal:  # keys after the query: at the floor, and zeroed after the product
        future = _future(i0, i1, kv, fq.device, rows.reversed)
        log_w.masked_fill_(future, log_floor(dtype))
    shift = log_w.amax(dim=-1, keepdim=True)
    weights = log_w.sub_(shift).clamp_min_(exp_floor(dtype)).exp_()
    kernel = torch.bmm(queries, fk[:, :kv].transpose(1, 2), out=ws.view(1, *weights.shape))
    kernel.mul_(weights)
    if future is not None:
        kernel.masked_fill_(future, 0.0)
    return _Block(kernel, weights, future, queries, rows.reversed)


def _future(i0: int, i1: int, kv: int, device: torch.device, reverse: bool) -> Tensor:
    """``(r, kv)`` True where key j comes after the query (rows i0..i1−1, or i1−1..i0)."""
    i = torch.arange(i0, i1, device=device)
    i = (i.flip(0) if reverse else i)[:, None]
    return torch.arange(kv, device=device)[None, :] > i


#: CPU cost constants of :func:`blocked_is_cheaper`, fitted on the 2-core development CPU
#: (forward, fp32, M = 32–256, L = 2048–16384; docs/rpe.md): per kernel entry the blocked
#: form costs about ``M + Dv + 1`` multiply-adds plus BLOCKED_ENTRY_OVERHEAD for its
#: element-wise work, and each channel of the FFT about FFT_POINT_COST per ``n·log2 n``.
BLOCKED_ENTRY_OVERHEAD = 40.0
FFT_POINT_COST = 28.0


def blocked_is_cheaper(
    rows: int, lq: int, lk: int, m: int, dv: int, fft_points: int, *, causal: bool
) -> bool:
    """Whether the blocked exact form is predicted to be faster on the CPU than the FFT over
    ``M·(Dv+1)`` channels of ``fft_points`` points, for ``rows = B·H`` attention rows.

    Causal blocks stop at the diagonal (half the entries) while causal FFT products run in
    float64 (about twice the time)."""
    blocked = rows * lq * lk * (m + dv + 1 + BLOCKED_ENTRY_OVERHEAD) * (0.5 if causal else 1.0)
    fft = rows * m * (dv + 1) * fft_points * math.log2(max(2, fft_points)) * FFT_POINT_COST
    return blocked <= fft * (2.0 if causal else 1.0)


#: off the CPU, :func:`prefer_blocked` takes the blocked form up to this many kernel entries
#: (B·H·Lq·Lk) and the FFT beyond
AUTO_DENSE_ELEMENTS = 1 << 22


def prefer_blocked(
    rows: int,
    lq: int,
    lk: int,
    m: int,
    dv: int,
    fft_points: int,
    *,
    causal: bool,
    device: torch.device,
) -> bool:
    """Whether to take the blocked exact form rather than the FFT: on the CPU by the cost
    model of :func:`blocked_is_cheaper`, elsewhere up to :data:`AUTO_DENSE_ELEMENTS` entries."""
    if device.type != "cpu":
        return rows * lq * lk <= AUTO_DENSE_ELEMENTS
    return blocked_is_cheaper(rows, lq, lk, m, dv, fft_points, causal=causal)
