"""Non-causal linear attention as Triton kernels, forward and backward: the result of
:func:`kattn.functional.linear_attention_parallel` (Katharopoulos et al. 2020, eq. 5; Luo et
al. 2021, eq. 3), O(L·M·Dv) time.

``S = Σ_j w_j φ(k_j) v_jᵀ`` ``(M, Dv)`` and ``z = Σ_j w_j φ(k_j)`` ``(M,)`` are summed by
one program per (batch, head) and block of value columns, then every block of queries reads
them: ``out_i = φ(q_i)·S / guard(φ(q_i)·z)``. With key log-scales ``s_j`` the weights are
``w_j = exp(s_j − max_l s_l)`` (at most 1; the shift cancels in the ratio), else 1. Lq may
differ from Lk. The backward takes the same two steps: ``dS = Σ_i φ(q_i) do_iᵀ`` and
``dz = Σ_i δ_i φ(q_i)`` (``do``, ``δ`` as in :mod:`kattn.ops.triton.linear_backward`), then
``dq_i = S do_i + δ_i z``, ``dk_j = w_j (dS v_j + dz)``, ``dv_j = w_j dSᵀ φ(k_j)`` and
``ds_j = φ(k_j)·dk_j``. Sums in fp32 (fp64 for fp64 inputs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...functional.numerics import DEFAULT_EPS, accumulation_dtype, exp_nonpositive
from .common import (
    SCAN_STAGES,
    acc_type,
    block,
    checked_inputs,
    dot_precision,
    guard,
    masked_keys,
    tl,
    triton,
)
from .linear_backward import output_gradients
from .recompute import linear_reference_grads

__all__ = ["linear_attention_triton"]

#: rows per block of the kernels.
ROWS = 32
#: most value columns one summing program holds.
MAX_VALUE_BLOCK = 64


@triton.jit
def _weighted_sums(
    x_ptr, y_ptr, a_ptr, b_ptr, sy_ptr, sx_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, HAS_A: tl.constexpr,
    HAS_B: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """``sy = Σ_j x_j (a_j y_j)ᵀ`` ``(M, Dv)`` and ``sx = Σ_j b_j x_j`` ``(M,)``."""
    seq = tl.program_id(0).to(tl.int64)
    vb = tl.program_id(1)
    x_ptr += seq * length * m
    y_ptr += seq * length * dv
    a_ptr += seq * length
    b_ptr += seq * length
    cols_m = tl.arange(0, BM)
    cols_v = vb * BDV + tl.arange(0, BDV)
    rows = tl.arange(0, C)
    sy = tl.zeros((BM, BDV), dtype=ACC)
    sx = tl.zeros((BM,), dtype=ACC)
    for start in range(0, length, C):
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        x = tl.load(x_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        y = tl.load(y_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        if HAS_A:
            y = y * tl.load(a_ptr + pos, mask=inside, other=0.0).to(ACC)[:, None]
        sy += tl.dot(tl.trans(x), y, input_precision=PRECISION)
        if HAS_B:
            sx += tl.sum(x * tl.load(b_ptr + pos, mask=inside, other=0.0).to(ACC)[:, None], axis=0)
        else:
            sx += tl.sum(x, axis=0)
    seq_m = seq * m
    tl.store(sy_ptr + seq_m * dv + cols_m[:, None] * dv + cols_v[None, :], sy,
             mask=(cols_m[:, None] < m) & (cols_v[None, :] < dv))  # fmt: skip
    if vb == 0:
        tl.store(sx_ptr + seq_m + cols_m, sx, mask=cols_m < m)


@triton.jit
def _state_products(
    x_ptr, sy_ptr, sx_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The block of rows of this program: ``x (C, BM)``, ``x·S (C, BDV)``, ``x·z (C,)``,
    the row positions and which rows exist."""
    seq = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * C + tl.arange(0, C)
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    inside = rows < length
    fm = inside[:, None] & (cols_m[None, :] < m)
    x = tl.load(x_ptr + seq * length * m + rows[:, None] * m + cols_m[None, :], mask=fm,
                other=0.0).to(ACC)  # fmt: skip
    in_state = (cols_m[:, None] < m) & (cols_v[None, :] < dv)
    sy = tl.load(sy_ptr + seq * m * dv + cols_m[:, None] * dv + cols_v[None, :], mask=in_state,
                 other=0.0)  # fmt: skip
    sx = tl.load(sx_ptr + seq * m + cols_m, mask=cols_m < m, other=0.0)
    xs = tl.dot(x, sy, input_precision=PRECISION)
    return x, xs, tl.sum(x * sx[None, :], axis=1), rows, inside


@triton.jit
def _noncausal_out(
    q_ptr, sy_ptr, sx_ptr, o_ptr, den_ptr, length, m, dv, eps,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    _, num, den, rows, inside = _state_products(q_ptr, sy_ptr, sx_ptr, length, m, dv, C, BM, BDV,
                                                ACC, PRECISION)  # fmt: skip
    cols_v = tl.arange(0, BDV)
    out = num / guard(den, eps)[:, None]
    fv = inside[:, None] & (cols_v[None, :] < dv)
    tl.store(o_ptr + seq * length * dv + rows[:, None] * dv + cols_v[None, :],
             out.to(o_ptr.dtype.element_ty), mask=fv)  # fmt: skip
    tl.store(den_ptr + seq * length + rows, den.to(den_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _noncausal_dq(
    do_ptr, dd_ptr, sy_ptr, sx_ptr, dq_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """``dq_i = S do_i + δ_i z``."""
    seq = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * C + tl.arange(0, C)
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    inside = rows < length
    fv = inside[:, None] & (cols_v[None, :] < dv)
    fm = inside[:, None] & (cols_m[None, :] < m)
    do = tl.load(do_ptr + seq * length * dv + rows[:, None] * dv + cols_v[None, :], mask=fv,
                 other=0.0).to(ACC)  # fmt: skip
    dd = tl.load(dd_ptr + seq * length + rows, mask=inside, other=0.0).to(ACC)
    in_state = (cols_m[:, None] < m) & (cols_v[None, :] < dv)
    sy = tl.load(sy_ptr + seq * m * dv + cols_m[:, None] * dv + cols_v[None, :], mask=in_state,
                 other=0.0)  # fmt: skip
    sx = tl.load(sx_ptr + seq * m + cols_m, mask=cols_m < m, other=0.0)
    dq = tl.dot(do, tl.trans(sy), input_precision=PRECISION) + dd[:, None] * sx[None, :]
    tl.store(dq_ptr + seq * length * m + rows[:, None] * m + cols_m[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=fm)  # fmt: skip


@triton.jit
def _noncausal_dkv(
    k_ptr, v_ptr, w_ptr, dsy_ptr, dsx_ptr, dk_ptr, dv_ptr, ds_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, HAS_S: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """``dk_j = w_j (dS v_j + dz)``, ``dv_j = w_j dSᵀ φ(k_j)``, ``ds_j = φ(k_j)·dk_j``."""
    seq = tl.program_id(0).to(tl.int64)
    k, d_v, _, rows, inside = _state_products(k_ptr, dsy_ptr, dsx_ptr, length, m, dv, C, BM,
                                              BDV, ACC, PRECISION)  # fmt: skip
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    fm = inside[:, None] & (cols_m[None, :] < m)
    fv = inside[:, None] & (cols_v[None, :] < dv)
    v = tl.load(v_ptr + seq * length * dv + rows[:, None] * dv + cols_v[None, :], mask=fv,
                other=0.0).to(ACC)  # fmt: skip
    in_state = (cols_m[:, None] < m) & (cols_v[None, :] < dv)
    dsy = tl.load(dsy_ptr + seq * m * dv + cols_m[:, None] * dv + cols_v[None, :], mask=in_state,
                  other=0.0)  # fmt: skip
    dsx = tl.load(dsx_ptr + seq * m + cols_m, mask=cols_m < m, other=0.0)
    dk = tl.dot(v, tl.trans(dsy), input_precision=PRECISION) + dsx[None, :]
    if HAS_S:
        w = tl.load(w_ptr + seq * length + rows, mask=inside, other=0.0).to(ACC)
        dk = dk * w[:, None]
        d_v = d_v * w[:, None]
        ds = tl.sum(k * dk, axis=1)
        tl.store(ds_ptr + seq * length + rows, ds.to(ds_ptr.dtype.element_ty), mask=inside)
    tl.store(dk_ptr + seq * length * m + rows[:, None] * m + cols_m[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=fm)  # fmt: skip
    tl.store(dv_ptr + seq * length * dv + rows[:, None] * dv + cols_v[None, :],
             d_v.to(dv_ptr.dtype.element_ty), mask=fv)  # fmt: skip


def _state_precision(m: int, dv: int, dtype: torch.dtype) -> str:
    """``tl.dot`` precision of the kernels that hold a whole ``M × Dv`` state: that of
    :func:`~.common.dot_precision` (TF32 tensor cores for half inputs) up to 128 × 128, IEEE
    products beyond (tensor-core operand layouts of a 256 × 128 state would pass sm_80's
    shared memory)."""
    return dot_precision(dtype) if block(m) * block(dv) <= 128 * 128 else "ieee"


def _sums(
    x: Tensor, y: Tensor, a: Tensor | None, b: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``Σ_j x_j (a_j y_j)ᵀ`` ``(B, H, M, Dv)`` and ``Σ_j b_j x_j`` ``(B, H, M)`` (products
    at the precision of inputs of ``dtype``, the values' dtype of the attention) in the
    accumulation dtype (``a``, ``b`` ``(B, H, L)``; None for weights 1)."""
    bsz, h, length, m = x.shape
    dv = y.shape[-1]
    acc = accumulation_dtype(y.dtype)
    sy = x.new_zeros(bsz, h, m, dv, dtype=acc)
    sx = x.new_zeros(bsz, h, m, dtype=acc)
    if length and m and dv:
        block_v = min(block(dv), MAX_VALUE_BLOCK)
        _weighted_sums[(bsz * h, triton.cdiv(dv, block_v))](
            x, y, x if a is None else a, x if b is None else b, sy, sx, length, m, dv,
            C=ROWS, BM=block(m), BDV=block_v, HAS_A=a is not None, HAS_B=b is not None,
            ACC=acc_type(y.dtype), PRECISION=dot_precision(dtype),
            num_stages=SCAN_STAGES,
        )  # fmt: skip
    return sy, sx


class _NonCausalLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fq: Tensor, fk: Tensor, v: Tensor, s: Tensor | None, eps: float):
        b, h, lq, m = fq.shape
        dv = v.shape[-1]
        w = None if s is None else exp_nonpositive(s - s.amax(dim=-1, keepdim=True))
        sy, sx = _sums(fk, v, w, w, v.dtype)
        out = torch.empty(b, h, lq, dv, dtype=v.dtype, device=v.device)
        den = torch.empty(b, h, lq, dtype=sy.dtype, device=v.device)
        sizes = dict(C=ROWS, BM=block(m), BDV=block(dv), ACC=acc_type(v.dtype))
        sizes["PRECISION"] = _state_precision(m, dv, v.dtype)
        if out.numel():
            grid = (b * h, triton.cdiv(lq, ROWS))
            _noncausal_out[grid](fq, sy, sx, out, den, lq, m, dv, eps, **sizes)
        ctx.save_for_backward(fq, fk, v, s, w, sy, sx, out, den)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        fq, fk, v, s, w, sy, sx, out, den = ctx.saved_tensors
        if torch.is_grad_enabled():  # backward(create_graph=True): the PyTorch path's graph
            wanted = tuple(ctx.needs_input_grad[:4])
            grads = linear_reference_grads((fq, fk, v, s), wanted, grad, causal=False, eps=ctx.eps)
            return (*grads, None)
        b, h, lq, m = fq.shape
        lk, dv = v.shape[2:]
        do, dd = output_gradients(grad, out, den, ctx.eps)
        dsy, dsx = _sums(fq, do, None, dd, v.dtype)
        dq, dk, d_v = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(v)
        ds = None if s is None else torch.empty_like(s)
        sizes = dict(C=ROWS, BM=block(m), BDV=block(dv), ACC=acc_type(v.dtype))
        sizes["PRECISION"] = _state_precision(m, dv, v.dtype)
        if dq.numel():
            _noncausal_dq[(b * h, triton.cdiv(lq, ROWS))](do, dd, sy, sx, dq, lq, m, dv, **sizes)
        if dk.numel() or d_v.numel():
            _noncausal_dkv[(b * h, triton.cdiv(lk, ROWS))](
                fk, v, fk if w is None else w, dsy, dsx, dk, d_v, fk if ds is None else ds,
                lk, m, dv, HAS_S=s is not None, **sizes,
            )  # fmt: skip
        return dq, dk, d_v, ds, None


def linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Non-causal linear attention of query features ``phi_q`` ``(B, H, Lq, M)``, key
    features ``phi_k`` ``(B, H, Lk, M)`` and values ``v`` ``(B, H, Lk, Dv)`` by the Triton
    kernels, forward and backward; the result of
    :func:`kattn.functional.linear_attention_parallel`.

    Args:
        k_log_scale: ``(B, H, Lk)`` key log-scales (``φ(k_j) = phi_k_j·exp(s_j)``) or None.
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that count nowhere.
        eps: guard of the normaliser (``|den| ≥ eps``, sign kept).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.

    Raises:
        ValueError: tensors on the CPU outside the interpreter, or mismatched shapes.
    """
    s = checked_inputs(phi_q, phi_k, v, k_log_scale)
    fk, v, s = masked_keys(phi_k, v, s, key_padding_mask)
    out: Tensor = _NonCausalLinear.apply(phi_q.contiguous(), fk, v, s, float(eps))
    return out
