"""The backward of the windowed relative-position sums (:func:`rpe_window_sums_triton`, the
exact Toeplitz kernel and the banded kernel's band) as two Triton kernels, in the form of flash
attention's backward: one program per block of queries for their gradients and the
coefficients', one per block of keys for theirs.

Per (batch, head), the sums are ``num_i = Σ_j A_ij v_j`` and ``den_i = Σ_j A_ij`` with
``A_ij = w_ij φ(q_i)·φ(k_j)`` and ``w_ij = exp(b_{j−i} + s_j − m_i)`` over the keys j that
query i sees. The row maxima ``m_i`` cancel in the attention's output (it reads ``num·e^m``
and ``den·e^m``), so they are held fixed, as the PyTorch paths hold theirs. With
``a_ij = dnum_i·v_j + dden_i``:

* ``dq_i = Σ_j w_ij a_ij φ(k_j)`` and ``db_o = Σ_{j−i=o} A_ij a_ij`` (summed over the batch;
  offsets beyond the table's ends add to its ends), by query blocks: each C×C block of
  ``A ∘ a`` is summed along its 2C − 1 diagonals (a ``tl.gather`` that lines the diagonals up
  as columns) and added to its batch row's table by one atomic add per diagonal;
* ``dk_j = Σ_i w_ij a_ij φ(q_i)`` and ``dv_j = Σ_i A_ij dnum_i``, by key blocks, reading the
  forward's ``m_i``, so that every weight is at most 1 here too;
* ``ds_j = Σ_i A_ij a_ij = φ(k_j)·dk_j``.

The coefficients' gradient is summed by atomic adds, in an order that may vary between runs
(fp32 rounding); everything else is summed in a fixed order. Sums are fp32 (fp64 for fp64
inputs); products at the forward's precision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...functional.numerics import accumulation_dtype
from .common import tl, triton
from .rpe_window import _key_span, _tile, _window_logits, rpe_window_sums_triton, window_launch

__all__ = ["WindowSums", "window_sums"]


@triton.jit
def _window_dq(
    q_ptr, k_ptr, v_ptr, s_ptr, t_ptr, top_ptr, dn_ptr, dd_ptr, dq_ptr, db_ptr,
    lq, lk, m, dv, heads, table, zero, lo, hi,
    CAUSAL: tl.constexpr, HAS_S: tl.constexpr, WANT_Q: tl.constexpr, WANT_B: tl.constexpr,
    BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
    BDV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    i0 = tl.program_id(1) * BQ
    q_ptr += seq * lq * m
    dq_ptr += seq * lq * m
    k_ptr += seq * lk * m
    v_ptr += seq * lk * dv
    s_ptr += seq * lk
    t_ptr += (seq % heads) * table
    db_ptr += seq * table
    top_ptr += seq * lq
    dd_ptr += seq * lq
    dn_ptr += seq * lq * dv
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = i0 + tl.arange(0, BQ)
    in_q = rows < lq
    fq = in_q[:, None] & (cols_m[None, :] < m)
    q = _tile(q_ptr, rows, in_q, cols_m, m, ACC)
    dn = _tile(dn_ptr, rows, in_q, cols_v, dv, ACC)
    dd = tl.load(dd_ptr + rows, mask=in_q, other=0.0).to(ACC)
    top = tl.load(top_ptr + rows, mask=in_q, other=0.0).to(ACC)
    dq = tl.zeros((BQ, BM), dtype=ACC)
    # the diagonals of a block: column d of the gathered block holds entry (r, d − (BQ−1) + r)
    diag = tl.arange(0, BD)
    pick = diag[None, :] - (BQ - 1) + tl.arange(0, BQ)[:, None]
    on_diag = (pick >= 0) & (pick < BK)
    pick = tl.minimum(tl.maximum(pick, 0), BK - 1)
    first, last = _key_span(i0, lo, hi, lk, BQ, CAUSAL)
    for j0 in range(first, last + 1, BK):
        keys = j0 + tl.arange(0, BK)
        in_k = keys <= last
        k = _tile(k_ptr, keys, in_k, cols_m, m, ACC)
        v = _tile(v_ptr, keys, in_k, cols_v, dv, ACC)
        logits = _window_logits(t_ptr, s_ptr, rows, keys, in_q, in_k, zero, table, lo, hi,
                                CAUSAL, HAS_S, ACC)  # fmt: skip
        w = tl.exp(logits - top[:, None])  # 0 where unseen, else <= 1
        wa = w * (tl.dot(dn, tl.trans(v), input_precision=PRECISION) + dd[:, None])
        if WANT_Q:
            dq += tl.dot(wa, k, input_precision=PRECISION)
        if WANT_B:
            p = wa * tl.dot(q, tl.trans(k), input_precision=PRECISION)
            sums = tl.sum(tl.where(on_diag, tl.gather(p, pick, axis=1), 0.0), axis=0)
            index = j0 - i0 - (BQ - 1) + diag + zero  # the table entry of each diagonal
            index = tl.minimum(tl.maximum(index, 0), table - 1)
            tl.atomic_add(db_ptr + index, sums, mask=diag < BQ + BK - 1, sem="relaxed")
    if WANT_Q:
        tl.store(dq_ptr + rows[:, None] * m + cols_m[None, :], dq.to(dq_ptr.dtype.element_ty),
                 mask=fq)  # fmt: skip


@triton.jit
def _window_dkv(
    q_ptr, k_ptr, v_ptr, s_ptr, t_ptr, top_ptr, dn_ptr, dd_ptr, dk_ptr, dv_ptr, ds_ptr,
    lq, lk, m, dv, heads, table, zero, lo, hi,
    CAUSAL: tl.constexpr, HAS_S: tl.constexpr, WANT_K: tl.constexpr, WANT_S: tl.constexpr,
    WANT_V: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    j0 = tl.program_id(1) * BK
    q_ptr += seq * lq * m
    k_ptr += seq * lk * m
    dk_ptr += seq * lk * m
    v_ptr += seq * lk * dv
    dv_ptr += seq * lk * dv
    s_ptr += seq * lk
    ds_ptr += seq * lk
    t_ptr += (seq % heads) * table
    top_ptr += seq * lq
    dd_ptr += seq * lq
    dn_ptr += seq * lq * dv
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    keys = j0 + tl.arange(0, BK)
    in_k = keys < lk
    fk = in_k[:, None] & (cols_m[None, :] < m)
    fv = in_k[:, None] & (cols_v[None, :] < dv)
    k = _tile(k_ptr, keys, in_k, cols_m, m, ACC)
    v = _tile(v_ptr, keys, in_k, cols_v, dv, ACC)
    dk = tl.zeros((BK, BM), dtype=ACC)
    d_v = tl.zeros((BK, BDV), dtype=ACC)
    # the queries that see some key of the block: lo <= j − i <= hi (and i >= j if causal)
    first = tl.maximum(j0 - hi, 0)
    if CAUSAL:
        first = tl.maximum(first, j0)
    last = tl.minimum(j0 + BK - 1 - lo, lq - 1)
    for i0 in range(first, last + 1, BQ):
        rows = i0 + tl.arange(0, BQ)
        in_q = rows <= last
        q = _tile(q_ptr, rows, in_q, cols_m, m, ACC)
        dn = _tile(dn_ptr, rows, in_q, cols_v, dv, ACC)
        dd = tl.load(dd_ptr + rows, mask=in_q, other=0.0).to(ACC)
        top = tl.load(top_ptr + rows, mask=in_q, other=0.0).to(ACC)
        logits = _window_logits(t_ptr, s_ptr, rows, keys, in_q, in_k, zero, table, lo, hi,
                                CAUSAL, HAS_S, ACC)  # fmt: skip
        w = tl.exp(logits - top[:, None])  # (BQ, BK): 0 where unseen, else <= 1
        if WANT_V:
            scores = w * tl.dot(q, tl.trans(k), input_precision=PRECISION)
            d_v += tl.dot(tl.trans(scores), dn, input_precision=PRECISION)
        if WANT_K or WANT_S:
            wa = w * (tl.dot(dn, tl.trans(v), input_precision=PRECISION) + dd[:, None])
            dk += tl.dot(tl.trans(wa), q, input_precision=PRECISION)
    if WANT_K:
        tl.store(dk_ptr + keys[:, None] * m + cols_m[None, :], dk.to(dk_ptr.dtype.element_ty),
                 mask=fk)  # fmt: skip
    if WANT_S:
        ds = tl.sum(k * dk, axis=1)
        tl.store(ds_ptr + keys, ds.to(ds_ptr.dtype.element_ty), mask=in_k)
    if WANT_V:
        tl.store(dv_ptr + keys[:, None] * dv + cols_v[None, :], d_v.to(dv_ptr.dtype.element_ty),
                 mask=fv)  # fmt: skip


class WindowSums(torch.autograd.Function):
    """:func:`rpe_window_sums_triton` differentiated by the two kernels of this module, with
    no PyTorch recomputation: ``(num, den, m)`` from ``(fq, fk, v, s or None, log_coeff,
    zero, offsets, causal, chunk)`` (the arguments of :func:`rpe_window_sums_triton`); the
    row maxima ``m`` are not differentiable."""

    @staticmethod
    def forward(
        ctx: Any,
        fq: Tensor,
        fk: Tensor,
        v: Tensor,
        s: Tensor | None,
        log_coeff: Tensor,
        zero: int,
        offsets: tuple[int, int],
        causal: bool,
        chunk: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        num, den, top = rpe_window_sums_triton(
            fq, fk, v, s, log_coeff, zero, offsets, causal=causal, chunk=chunk
        )
        ctx.save_for_backward(fq, fk, v, s, log_coeff, top)
        ctx.window = (zero, offsets, causal, chunk)
        ctx.mark_non_differentiable(top)
        return num, den, top

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, d_num: Tensor, d_den: Tensor, _d_top: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        fq, fk, v, s, log_coeff, top = ctx.saved_tensors
        need_q, need_k, need_v, need_s, need_b = ctx.needs_input_grad[:5]
        if 0 in fq.shape[:3] or fk.shape[2] == 0:  # nothing was summed
            wanted = zip((fq, fk, v, s, log_coeff), ctx.needs_input_grad[:5], strict=True)
            zeros = [torch.zeros_like(x) if need else None for x, need in wanted]
            return (*zeros, None, None, None, None)
        zero, offsets, causal, chunk = ctx.window
        b, h, _, _ = fq.shape
        lk = fk.shape[2]
        acc = accumulation_dtype(v.dtype)
        go = window_launch(fq, fk, v, s, log_coeff, zero, offsets, causal=causal, chunk=chunk)
        fq, fk, v, s_arg, table = go.inputs
        d_num, d_den = d_num.to(acc).contiguous(), d_den.to(acc).contiguous()
        dq = dk = d_v = ds = db = None
        # an input stands in for a gradient that is not wanted: the kernels never write it
        if need_q or need_b:
            dq = torch.empty_like(fq) if need_q else fq
            db = torch.zeros(b, h, table.shape[-1], dtype=acc, device=v.device)
            _window_dq[go.grid_q](
                *go.inputs, top, d_num, d_den, dq, db, *go.scalars,
                WANT_Q=need_q, WANT_B=need_b, BD=2 * go.chunk, **go.meta,
            )  # fmt: skip
        if need_k or need_v or need_s:
            dk = torch.empty_like(fk) if need_k else fk
            d_v = torch.empty_like(v) if need_v else v
            ds = torch.empty(b, h, lk, dtype=acc, device=v.device) if need_s else s_arg
            _window_dkv[go.grid_k](
                *go.inputs, top, d_num, d_den, dk, d_v, ds, *go.scalars,
                WANT_K=need_k, WANT_S=need_s, WANT_V=need_v, **go.meta,
            )  # fmt: skip
        return (
            dq if need_q else None,
            dk if need_k else None,
            d_v if need_v else None,
            ds.to(s.dtype) if need_s and ds is not None else None,
            db.sum(dim=0).to(log_coeff.dtype) if need_b and db is not None else None,
            None,
            None,
            None,
            None,
        )


def window_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    zero: int,
    offsets: tuple[int, int],
    *,
    causal: bool,
    chunk: int,
    kernel_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`rpe_window_sums_triton`, differentiable by :class:`WindowSums` when
    ``kernel_grad`` (else not differentiable)."""
    if kernel_grad:
        out: tuple[Tensor, Tensor, Tensor] = WindowSums.apply(
            fq, fk, v, s, log_coeff, zero, offsets, causal, chunk
        )
        return out
    return rpe_window_sums_triton(fq, fk, v, s, log_coeff, zero, offsets, causal=causal,
                                  chunk=chunk)  # fmt: skip
