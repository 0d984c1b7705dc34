"""The windowed relative-position sums as a Triton kernel: what the exact Toeplitz kernel
(:mod:`kattn.ops.triton.toeplitz_blocked`) computes over every offset and the banded kernel
(:mod:`kattn.ops.triton.banded`) over its band.

``num_i = Σ_j exp(b_{j−i} + s_j − m_i) (φ(q_i)·φ(k_j)) v_j`` and ``den_i`` (the same without
``v_j``) over the keys j that query i sees (offsets ``lo <= j − i <= hi``, and ``j <= i`` when
causal), ``m_i`` the largest ``b_{j−i} + s_j`` among them. One program per (batch·head, block
of queries) walks its keys a block at a time, as flash attention does: it looks the
log-coefficients up in the ``(H, K)`` table, keeps the running maximum ``m_i`` and rescales its
fp32 sums whenever it grows, so nothing of size ``Lq·Lk`` is stored and no weight exceeds 1.
Its backward: :mod:`kattn.ops.triton.rpe_window_backward`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ...functional.numerics import accumulation_dtype
from .common import NO_OFFSET, SCAN_STAGES, acc_type, dot_precision, scan_tiles, tl, triton

__all__ = ["DEFAULT_BLOCK", "WindowLaunch", "rpe_window_sums_triton", "window_launch"]

#: queries per program and keys per step of the kernel.
DEFAULT_BLOCK = 32


@triton.jit
def _window_logits(t_ptr, s_ptr, rows, keys, in_q, in_k, zero, table, lo, hi,
                   CAUSAL: tl.constexpr, HAS_S: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """``b_{j−i} + s_j`` of a block of queries ``rows`` and keys ``keys``, ``−∞`` where the
    query does not see the key."""
    offsets = keys[None, :] - rows[:, None]
    seen = in_q[:, None] & in_k[None, :] & (offsets >= lo) & (offsets <= hi)
    if CAUSAL:
        seen = seen & (offsets <= 0)
    index = tl.minimum(tl.maximum(offsets + zero, 0), table - 1)
    logits = tl.load(t_ptr + index, mask=seen, other=0.0).to(ACC)
    if HAS_S:
        logits += tl.load(s_ptr + keys, mask=in_k, other=0.0).to(ACC)[None, :]
    return tl.where(seen, logits, float("-inf"))


@triton.jit
def _tile(ptr, rows, inside, cols, width, ACC: tl.constexpr):
    """Rows ``rows`` (where ``inside``) of a row-major ``(·, width)`` matrix, columns
    ``cols`` (0 beyond ``width``), as ``ACC``."""
    mask = inside[:, None] & (cols[None, :] < width)
    return tl.load(ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0).to(ACC)


@triton.jit
def _key_span(i0, lo, hi, lk, BQ: tl.constexpr, CAUSAL: tl.constexpr):
    """The first and last key that some query of the block ``i0 … i0 + BQ − 1`` sees."""
    first = tl.maximum(i0 + lo, 0)
    last = tl.minimum(i0 + BQ - 1 + hi, lk - 1)
    if CAUSAL:
        last = tl.minimum(last, i0 + BQ - 1)
    return first, last


@triton.jit
def _rpe_window_sums(
    q_ptr, k_ptr, v_ptr, s_ptr, t_ptr, num_ptr, den_ptr, max_ptr,
    lq, lk, m, dv, heads, table, zero, lo, hi, no_offset,
    CAUSAL: tl.constexpr, HAS_S: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    BM: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)  # (batch, head); B·H·L·M may pass 2³¹
    i0 = tl.program_id(1) * BQ
    q_ptr += seq * lq * m
    k_ptr += seq * lk * m
    v_ptr += seq * lk * dv
    s_ptr += seq * lk
    t_ptr += (seq % heads) * table
    num_ptr += seq * lq * dv
    den_ptr += seq * lq
    max_ptr += seq * lq
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = i0 + tl.arange(0, BQ)
    in_q = rows < lq
    q = _tile(q_ptr, rows, in_q, cols_m, m, ACC)
    num = tl.zeros((BQ, BDV), dtype=ACC)
    den = tl.zeros((BQ,), dtype=ACC)
    top = tl.zeros((BQ,), dtype=ACC) + no_offset  # m_i: the units of num and den
    # the keys some query of the block sees: offsets lo <= j − i <= hi (and j <= i if causal)
    first, last = _key_span(i0, lo, hi, lk, BQ, CAUSAL)
    for j0 in range(first, last + 1, BK):
        keys = j0 + tl.arange(0, BK)
        in_k = keys <= last
        k = _tile(k_ptr, keys, in_k, cols_m, m, ACC)
        v = _tile(v_ptr, keys, in_k, cols_v, dv, ACC)
        logits = _window_logits(t_ptr, s_ptr, rows, keys, in_q, in_k, zero, table, lo, hi,
                                CAUSAL, HAS_S, ACC)  # fmt: skip
        grown = tl.maximum(top, tl.max(logits, axis=1))
        rescale = tl.exp(top - grown)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        scores = scores * tl.exp(logits - grown[:, None])
        num = num * rescale[:, None] + tl.dot(scores, v, input_precision=PRECISION)
        den = den * rescale + tl.sum(scores, axis=1)
        top = grown
    fo = in_q[:, None] & (cols_v[None, :] < dv)
    tl.store(num_ptr + rows[:, None] * dv + cols_v[None, :], num, mask=fo)
    tl.store(den_ptr + rows, den, mask=in_q)
    tl.store(max_ptr + rows, top, mask=in_q)


def rpe_window_sums_triton(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    zero: int,
    offsets: tuple[int, int],
    *,
    causal: bool,
    chunk: int = DEFAULT_BLOCK,
) -> tuple[Tensor, Tensor, Tensor]:
    """The sums of the module docstring over the keys ``lo <= j − i <= hi`` (``offsets``).

    Args:
        fq: ``(B, H, Lq, M)``; fk: ``(B, H, Lk, M)``; v: ``(B, H, Lk, Dv)`` (padding zeroed).
        s: ``(B, H, Lk)`` key log-scales (padding at the floor), or None for 0.
        log_coeff: ``(H, K)``: entry ``zero + o`` is ``b`` of offset o, the ends holding for
            every offset beyond them.
        causal: only keys ``j <= i`` besides.
        chunk: queries per program and keys per step, a power of two from 16 to 128.

    Returns:
        ``num (B, H, Lq, Dv)``, ``den (B, H, Lq)`` and ``m (B, H, Lq)`` (a very negative
        number where a query sees no key), fp32.
    """
    b, h, lq, _ = fq.shape
    lk, dv = fk.shape[2], v.shape[-1]
    dtype = accumulation_dtype(v.dtype)
    num = torch.empty(b, h, lq, dv, dtype=dtype, device=v.device)
    den = torch.empty(b, h, lq, dtype=dtype, device=v.device)
    top = torch.empty(b, h, lq, dtype=dtype, device=v.device)
    if b * h * lq == 0 or lk == 0:  # nothing to sum (Dv = 0 alone still sums normalisers)
        return num.zero_(), den.zero_(), top.fill_(NO_OFFSET)
    go = window_launch(fq, fk, v, s, log_coeff, zero, offsets, causal=causal, chunk=chunk)
    _rpe_window_sums[go.grid_q](*go.inputs, num, den, top, *go.scalars, NO_OFFSET, **go.meta)
    return num, den, top


class WindowLaunch(NamedTuple):
    """What the window kernels, forward and backward, are launched with."""

    #: ``fq, fk, v, s, table``: contiguous; ``s`` a stand-in without log-scales (never read)
    inputs: tuple[Tensor, Tensor, Tensor, Tensor, Tensor]
    #: ``lq, lk, m, dv, heads, K, zero, lo, hi``
    scalars: tuple[int, ...]
    #: the constexpr arguments and ``num_stages``
    meta: dict[str, Any]
    #: programs over query blocks and over key blocks
    grid_q: tuple[int, int]
    grid_k: tuple[int, int]
    #: queries per block (and keys per step)
    chunk: int


def window_launch(
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
) -> WindowLaunch:
    """The inputs, sizes and tiles of a window kernel's launch (arguments as
    :func:`rpe_window_sums_triton`)."""
    b, h, lq, m = fq.shape
    lk, dv = fk.shape[2], v.shape[-1]
    dtype = accumulation_dtype(v.dtype)
    fq, fk, v = (x.contiguous() for x in (fq, fk, v))
    s_arg = fq if s is None else s.to(dtype).contiguous()
    table = log_coeff.detach().to(device=v.device, dtype=dtype).contiguous()
    c, block_m, block_v = scan_tiles(m, dv, chunk)
    meta = dict(CAUSAL=causal, HAS_S=s is not None, BQ=c, BK=c, BM=block_m, BDV=block_v,
                PRECISION=dot_precision(v.dtype), ACC=acc_type(v.dtype),
                num_stages=SCAN_STAGES)  # fmt: skip
    return WindowLaunch(
        inputs=(fq, fk, v, s_arg, table),
        scalars=(lq, lk, m, dv, h, table.shape[-1], zero, *offsets),
        meta=meta,
        grid_q=(b * h, triton.cdiv(lq, c)),
        grid_k=(b * h, triton.cdiv(lk, c)),
        chunk=c,
    )
