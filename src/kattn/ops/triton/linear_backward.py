"""The backward of causal linear attention as Triton kernels: the gradients of
:mod:`kattn.ops.triton.causal_linear` with respect to the query and key features, the values
and the key log-scales, in the same chunkwise form (one program per batch and head).

With ``A_ij = w_ij φ(q_i)·φ(k_j)`` (j ≤ i; ``w_ij = exp(s_j − r_i)``, 1 without log-scales),
``out_i = Σ_j A_ij v_j / den_i`` and ``den_i = guard(Σ_j A_ij)``, an output gradient ``g_i``
gives ``do_i = g_i / den_i`` and ``δ_i = −do_i·out_i`` (0 where the guard holds ``den_i``),
so that ``∂L/∂A_ij = do_i·v_j + δ_i``. Then

* ``dq_i = Σ_{j≤i} w_ij (do_i·v_j + δ_i) φ(k_j)`` — a forward scan over the prefix state
  ``(S, z)`` of the forward pass;
* ``dk_j = Σ_{i≥j} w_ij (do_i·v_j + δ_i) φ(q_i)`` and ``dv_j = Σ_{i≥j} A_ij do_i`` — a
  backward scan over the suffix sums ``Σ_i φ(q_i) do_iᵀ`` and ``Σ_i δ_i φ(q_i)``;
* ``ds_j = φ(k_j)·dk_j``, since every term that holds ``φ(k_j)`` holds ``exp(s_j)``.

The running offsets ``r_i`` carry no gradient (they cancel in the ratio), as in the PyTorch
path. Sums are in fp32 (fp64 for fp64 inputs); gradients have the dtypes of their inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...functional.numerics import guard_normaliser
from .common import SCAN_STAGES, acc_type, dot_precision, scan_tiles, tl, triton

__all__ = ["causal_backward", "output_gradients"]


@triton.jit
def _causal_dq(
    q_ptr, k_ptr, v_ptr, s_ptr, r_ptr, do_ptr, dd_ptr, dq_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, HAS_S: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    q_ptr += seq * length * m
    k_ptr += seq * length * m
    dq_ptr += seq * length * m
    v_ptr += seq * length * dv
    do_ptr += seq * length * dv
    s_ptr += seq * length
    r_ptr += seq * length
    dd_ptr += seq * length
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = tl.arange(0, C)
    causal = rows[:, None] >= rows[None, :]
    state = tl.zeros((BM, BDV), dtype=ACC)  # S = Σ_{j before the chunk} w φ(k_j) v_jᵀ
    total = tl.zeros((BM,), dtype=ACC)
    offset = tl.load(r_ptr).to(ACC)  # any value will do while the state is 0
    for start in range(0, length, C):
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        k = tl.load(k_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        v = tl.load(v_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        do = tl.load(do_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        dd = tl.load(dd_ptr + pos, mask=inside, other=0.0).to(ACC)
        d_scores = tl.dot(do, tl.trans(v), input_precision=PRECISION) + dd[:, None]  # (C, C)
        if HAS_S:
            s = tl.load(s_ptr + pos, mask=inside, other=0.0).to(ACC)
            r = tl.load(r_ptr + pos, mask=inside, other=0.0).to(ACC)
            r_end = tl.load(r_ptr + tl.minimum(start + C, length) - 1).to(ACC)
            weights = tl.exp(tl.minimum(s[None, :] - r[:, None], 0.0))
            d_scores = tl.where(causal, d_scores * weights, 0.0)
            q_scale = tl.exp(tl.minimum(offset - r, 0.0))
            k_scale = tl.exp(tl.minimum(s - r_end, 0.0))
            decay = tl.exp(tl.minimum(offset - r_end, 0.0))
            offset = r_end
        else:
            d_scores = tl.where(causal, d_scores, 0.0)
            q_scale = tl.full((C,), 1.0, ACC)
            k_scale = tl.full((C,), 1.0, ACC)
            decay = 1.0
        prefix = tl.dot(do, tl.trans(state), input_precision=PRECISION)
        prefix += dd[:, None] * total[None, :]
        dq = tl.dot(d_scores, k, input_precision=PRECISION) + q_scale[:, None] * prefix
        tl.store(dq_ptr + pos[:, None] * m + cols_m[None, :], dq.to(dq_ptr.dtype.element_ty),
                 mask=fm)  # fmt: skip
        k_in = k * k_scale[:, None]
        state = state * decay + tl.dot(tl.trans(k_in), v, input_precision=PRECISION)
        total = total * decay + tl.sum(k_in, axis=0)


@triton.jit
def _causal_dkv(
    q_ptr, k_ptr, v_ptr, s_ptr, r_ptr, do_ptr, dd_ptr, dk_ptr, dv_ptr, ds_ptr, length, m, dv,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, HAS_S: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    q_ptr += seq * length * m
    k_ptr += seq * length * m
    dk_ptr += seq * length * m
    v_ptr += seq * length * dv
    do_ptr += seq * length * dv
    dv_ptr += seq * length * dv
    s_ptr += seq * length
    r_ptr += seq * length
    dd_ptr += seq * length
    ds_ptr += seq * length
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = tl.arange(0, C)
    causal = rows[:, None] >= rows[None, :]
    # Σ_{i after the chunk} exp(R − r_i) φ(q_i) do_iᵀ and δ_i φ(q_i), R the chunk's end offset
    d_state = tl.zeros((BM, BDV), dtype=ACC)
    d_total = tl.zeros((BM,), dtype=ACC)
    chunks = tl.cdiv(length, C)
    for back in range(0, chunks):
        start = (chunks - 1 - back) * C
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        q = tl.load(q_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        k = tl.load(k_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        v = tl.load(v_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        do = tl.load(do_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        dd = tl.load(dd_ptr + pos, mask=inside, other=0.0).to(ACC)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        d_scores = tl.dot(do, tl.trans(v), input_precision=PRECISION) + dd[:, None]
        if HAS_S:
            s = tl.load(s_ptr + pos, mask=inside, other=0.0).to(ACC)
            r = tl.load(r_ptr + pos, mask=inside, other=0.0).to(ACC)
            r_end = tl.load(r_ptr + tl.minimum(start + C, length) - 1).to(ACC)
            r_before = tl.load(r_ptr + tl.maximum(start - 1, 0)).to(ACC)
            weights = tl.exp(tl.minimum(s[None, :] - r[:, None], 0.0))
            scores = tl.where(causal, scores * weights, 0.0)
            d_scores = tl.where(causal, d_scores * weights, 0.0)
            k_scale = tl.exp(tl.minimum(s - r_end, 0.0))
            q_scale = tl.exp(tl.minimum(r_before - r, 0.0))  # to the previous chunk's end
            decay = tl.exp(tl.minimum(r_before - r_end, 0.0))
        else:
            scores = tl.where(causal, scores, 0.0)
            d_scores = tl.where(causal, d_scores, 0.0)
            k_scale = tl.full((C,), 1.0, ACC)
            q_scale = tl.full((C,), 1.0, ACC)
            decay = 1.0
        dv_c = tl.dot(tl.trans(scores), do, input_precision=PRECISION)
        dv_c += k_scale[:, None] * tl.dot(k, d_state, input_precision=PRECISION)
        later = tl.dot(v, tl.trans(d_state), input_precision=PRECISION) + d_total[None, :]
        dk_c = tl.dot(tl.trans(d_scores), q, input_precision=PRECISION) + k_scale[:, None] * later
        tl.store(dk_ptr + pos[:, None] * m + cols_m[None, :], dk_c.to(dk_ptr.dtype.element_ty),
                 mask=fm)  # fmt: skip
        tl.store(dv_ptr + pos[:, None] * dv + cols_v[None, :], dv_c.to(dv_ptr.dtype.element_ty),
                 mask=fv)  # fmt: skip
        if HAS_S:
            ds = tl.sum(k * dk_c, axis=1)
            tl.store(ds_ptr + pos, ds.to(ds_ptr.dtype.element_ty), mask=inside)
        q_in = q * q_scale[:, None]
        d_state = d_state * decay + tl.dot(tl.trans(q_in), do, input_precision=PRECISION)
        d_total = d_total * decay + tl.sum(q_in * dd[:, None], axis=0)


def output_gradients(grad: Tensor, out: Tensor, den: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``do = g / guard(den)`` ``(…, L, Dv)`` and ``δ = −do·out`` ``(…, L)``, 0 where the
    guard holds the normaliser (no gradient reaches it there), in the dtype of ``den``."""
    do = grad.to(den.dtype) / guard_normaliser(den, eps)[..., None]
    dd = -(do * out.to(den.dtype)).sum(dim=-1) * (den.abs() >= eps)
    return do.contiguous(), dd.contiguous()


def causal_backward(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    r: Tensor | None,
    out: Tensor,
    den: Tensor,
    grad: Tensor,
    eps: float,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of causal linear attention with respect to ``fq``, ``fk`` ``(B, H, L, M)``,
    ``v`` ``(B, H, L, Dv)`` and the log-scales ``s`` ``(B, H, L)`` (None without them), from
    the forward's output ``out``, raw normalisers ``den`` ``(B, H, L)`` and running offsets
    ``r``, and the output gradient ``grad``. Inputs are contiguous."""
    b, h, length, m = fq.shape
    dv = v.shape[-1]
    do, dd = output_gradients(grad, out, den, eps)
    dq, dk, d_v = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(v)
    ds = None if s is None else torch.empty_like(s)
    if out.numel() == 0:
        return dq.zero_(), dk.zero_(), d_v.zero_(), None if ds is None else ds.zero_()
    acc = acc_type(v.dtype)
    s_arg, r_arg = (fq, fq) if s is None else (s, r)
    c, block_m, block_v = scan_tiles(m, dv, chunk)
    sizes = dict(C=c, BM=block_m, BDV=block_v, HAS_S=s is not None, ACC=acc)
    sizes.update(PRECISION=dot_precision(v.dtype), num_stages=SCAN_STAGES)
    _causal_dq[(b * h,)](fq, fk, v, s_arg, r_arg, do, dd, dq, length, m, dv, **sizes)
    _causal_dkv[(b * h,)](
        fq, fk, v, s_arg, r_arg, do, dd, dk, d_v, fq if ds is None else ds, length, m, dv, **sizes
    )
    return dq, dk, d_v, ds
