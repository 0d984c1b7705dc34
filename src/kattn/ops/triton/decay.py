"""Decaying relative positions as a Triton kernel: the chunkwise form of
:func:`kattn.functional.decay_linear_attention`, ``c_{j−i} = Σ_r α_r γ_r^{|j−i|}``.

The kernel computes, for each (batch, head, term) — one program each — the decayed causal sums
``num_i = Σ_{j<=i} γ^(i−j) exp(s_j − r_i) (φ(q_i)·φ(k_j)) v_j`` and ``den_i`` (the same
without ``v_j``), where ``r_i = max_{j<=i} (s_j + (i−j)·log γ)`` is the decayed running maximum
of the key log-scales ``s`` (0 without them): every factor is at most 1 and no offset reads a
future token. It walks the sequence a chunk of C tokens at a time: the masked ``C×C`` products
inside the chunk, the prefix state (``Σ φ(k) vᵀ`` and ``Σ φ(k)``, fp32, in units of the
offset at the chunk's start) for the tokens before it, then the chunk folded into the state.

The R terms (and, non-causal, the future side: the same kernel on the reversed sequence, keys
shifted by one so that ``j > i``) are combined outside the kernel in log space, as the PyTorch
path does. Gradients come from up to three more runs of the same kernel (:class:`DecayedSums`);
beyond the state sizes those fit (:func:`kernel_backward_fits`), and for a backward with
``create_graph=True``, they are those of the PyTorch path, recomputed in backward.
Inputs may be fp16, bf16, fp32 or fp64; sums are fp32 (fp64 for fp64 inputs); the output has
the dtype of ``v``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...functional.decay import decay_linear_attention, repeat_terms
from ...functional.numerics import (
    DEFAULT_EPS,
    accumulation_dtype,
    delayed,
    guard_normaliser,
    log_floor,
    one_length,
)
from .common import (
    NO_OFFSET,
    SCAN_STAGES,
    acc_type,
    block,
    check_chunk,
    checked_inputs,
    dot_precision,
    masked_keys,
    scan_tiles,
    tl,
    triton,
)
from .recompute import kernel_with_reference_grad
from .sizes import MAX_KERNEL_FEATURES, MAX_KERNEL_VALUES

__all__ = [
    "DecayedSums",
    "decay_linear_attention_triton",
    "decayed_causal_sums_triton",
    "kernel_backward_fits",
]

#: tokens per chunk of the kernel.
DEFAULT_CHUNK = 32


@triton.jit
def _decayed_causal_sums(
    q_ptr, k_ptr, v_ptr, s_ptr, g_ptr, num_ptr, den_ptr, off_ptr,
    length, m, dv, heads, terms, no_offset,
    HAS_S: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr,
    PRECISION: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)  # (batch, head); B·H·L·M may pass 2³¹
    term = tl.program_id(1).to(tl.int64)
    g = tl.load(g_ptr + (seq % heads) * terms + term).to(ACC)  # log γ <= 0
    q_ptr += seq * length * m
    k_ptr += seq * length * m
    v_ptr += seq * length * dv
    s_ptr += seq * length
    row = seq * terms + term
    num_ptr += row * length * dv
    den_ptr += row * length
    off_ptr += row * length
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = tl.arange(0, C)
    lag = (rows[:, None] - rows[None, :]).to(ACC)  # i − j inside a chunk
    seen = rows[:, None] >= rows[None, :]
    state = tl.zeros((BM, BDV), dtype=ACC)
    total = tl.zeros((BM,), dtype=ACC)
    offset = g * 0.0 + no_offset  # the state's units: exp(offset) at the previous token
    for start in range(0, length, C):
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        q = tl.load(q_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        k = tl.load(k_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        v = tl.load(v_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        if HAS_S:
            s = tl.load(s_ptr + pos, mask=inside, other=no_offset).to(ACC)
        else:
            s = tl.where(inside, 0.0, no_offset)
        # log of each in-chunk factor γ^(i−j) exp(s_j), and of the state's, before the shift r_i
        logits = tl.where(seen, s[None, :] + lag * g, float("-inf"))
        carried = offset + (rows + 1).to(ACC) * g
        r = tl.maximum(tl.max(logits, axis=1), carried)
        weights = tl.exp(logits - r[:, None])
        to_query = tl.exp(carried - r)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * weights
        num = tl.dot(scores, v, input_precision=PRECISION)
        num += to_query[:, None] * tl.dot(q, state, input_precision=PRECISION)
        den = tl.sum(scores, axis=1) + to_query * tl.sum(q * total[None, :], axis=1)
        tl.store(num_ptr + pos[:, None] * dv + cols_v[None, :], num, mask=fv)
        tl.store(den_ptr + pos, den, mask=inside)
        tl.store(off_ptr + pos, r, mask=inside)
        # the state after the chunk, in units of the chunk's last offset
        last = tl.max(tl.where(rows == C - 1, r, float("-inf")), axis=0)
        k_in = k * tl.exp(s + (C - 1 - rows).to(ACC) * g - last)[:, None]
        rescale = tl.exp(offset + C * g - last)
        state = state * rescale + tl.dot(tl.trans(k_in), v, input_precision=PRECISION)
        total = total * rescale + tl.sum(k_in, axis=0)
        offset = last


def decayed_causal_sums_triton(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_decay: Tensor,
    chunk: int,
    products_of: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The decayed causal sums of the module docstring, one set per head and term.

    Args:
        fq, fk: ``(B, H, L, M)``; v: ``(B, H, L, Dv)`` (padding zeroed already).
        s: ``(B, H, L)`` key log-scales (padding at the floor), or None for 0.
        log_decay: ``(H, R)`` log-decays ``log γ <= 0`` (zeros: no decay).
        chunk: tokens per chunk, a power of two from 16 to 128.
        products_of: the dtype whose ``tl.dot`` precision the products take (None: v's; the
            backward's fp32 operands of half inputs keep the half inputs' TF32 products).

    Returns:
        ``num (B, H, R, L, Dv)``, ``den (B, H, R, L)`` and the offsets ``r (B, H, R, L)``,
        in the accumulation dtype of ``v``.
    """
    b, h, length, m = fq.shape
    dv, r = v.shape[-1], log_decay.shape[-1]
    fq, fk, v = (x.contiguous() for x in (fq, fk, v))
    dtype = accumulation_dtype(v.dtype)
    num = torch.empty(b, h, r, length, dv, dtype=dtype, device=v.device)
    den = torch.empty(b, h, r, length, dtype=dtype, device=v.device)
    off = torch.empty(b, h, r, length, dtype=dtype, device=v.device)
    if num.numel() == 0:
        return num, den, off
    s_arg = fq if s is None else s.to(dtype).contiguous()  # (never read without HAS_S)
    g = log_decay.detach().to(device=v.device, dtype=dtype).contiguous()
    c, block_m, block_v = scan_tiles(m, dv, chunk)
    _decayed_causal_sums[(b * h, r)](
        fq, fk, v, s_arg, g, num, den, off, length, m, dv, h, r, NO_OFFSET,
        HAS_S=s is not None, C=c, BM=block_m, BDV=block_v,
        PRECISION=dot_precision(products_of or v.dtype), ACC=acc_type(v.dtype),
        num_stages=SCAN_STAGES,
    )  # fmt: skip
    return num, den, off


def kernel_backward_fits(m: int, dv: int) -> bool:
    """Whether the backward's scans over ``m`` features and ``dv`` value columns run by the
    kernel: their largest state, ``(Dv + 1) × M`` (the ``dq`` and ``dk`` scans), is at most
    the forward's largest checked one (:data:`~kattn.ops.triton.sizes.MAX_KERNEL_FEATURES`
    × :data:`~kattn.ops.triton.sizes.MAX_KERNEL_VALUES`); the launches are compiled for
    sm_80 and sm_90 by ``tests/ops/test_triton_shared_memory.py``, fp64 included. Larger
    calls take the PyTorch path's gradients."""
    return block(dv + 1) * block(m) <= MAX_KERNEL_FEATURES * MAX_KERNEL_VALUES


class DecayedSums(torch.autograd.Function):
    """:func:`decayed_causal_sums_triton` differentiated by up to three more runs of the same
    kernel, with no PyTorch recomputation: ``(num, den, off)`` from ``(fq, fk, v, s or None,
    log_decay (H, R), chunk)``; ``off`` is not differentiable.

    Per (batch, head, term), the sums are ``num_i = Σ_{j<=i} W_ij (φ(q_i)·φ(k_j)) v_j`` and
    ``den_i = Σ_{j<=i} W_ij (φ(q_i)·φ(k_j))`` with ``W_ij = exp(s_j + (i−j)·log γ − r_i)``. The
    offsets ``r_i`` cancel in the attention's output (it reads ``num·e^r`` and ``den·e^r``), so
    they are held fixed: the gradient with them fixed is the whole gradient. With
    ``a_ij = dnum_i·v_j + dden_i`` and ``A_ij = W_ij (φ(q_i)·φ(k_j))``:

    - ``dq_i = Σ_{j<=i} W_ij ([dnum_i, dden_i]·[v_j, 1]) φ(k_j)``: the kernel's causal sum with
      queries ``[dnum, dden]``, keys ``[v, 1]`` and values ``φ(k)``, whose offsets are the
      forward's (they depend on ``s`` and ``γ`` alone);
    - ``dv_j = Σ_{i>=j} W_ij (φ(k_j)·φ(q_i)) dnum_i`` and ``dk_j = Σ_{i>=j} W_ij a_ij φ(q_i)``: the
      kernel on the reversed sequence, the summed index i carrying the log-scale ``−r_i``; it
      returns them in units of its own offsets ``r'_j``, and ``s_j + r'_j <= 0`` (as ``r_i >= s_j
      + (i−j)·log γ``), so the factor ``exp(s_j + r'_j)`` that restores them never overflows;
    - ``ds_j = Σ_i A_ij a_ij = φ(k_j)·dk_j`` and ``d log γ = Σ_ij (i−j) A_ij a_ij = Σ_i (i−c)
      φ(q_i)·dq_i − Σ_j (j−c) φ(k_j)·dk_j`` (any c; the middle of the sequence).

    The terms run as heads of their own, ``(B, H·R)``, since each has its own queries in the
    backward. Sums in fp32 (fp64 for fp64 inputs), products at the forward's precision.
    """

    @staticmethod
    def forward(
        ctx: Any, fq: Tensor, fk: Tensor, v: Tensor, s: Tensor | None, log_decay: Tensor, chunk: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        num, den, off = decayed_causal_sums_triton(fq, fk, v, s, log_decay, chunk)
        ctx.save_for_backward(fq, fk, v, s, log_decay, off)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(off)
        return num, den, off

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, d_num: Tensor, d_den: Tensor, _d_off: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        fq, fk, v, s, log_decay, off = ctx.saved_tensors
        need_q, need_k, need_v, need_s, need_g = ctx.needs_input_grad[:5]
        b, h, length = fq.shape[:3]
        rounds = log_decay.shape[-1]
        acc = accumulation_dtype(v.dtype)

        def scan(
            queries: Tensor, keys: Tensor, values: Tensor, scales: Tensor | None
        ) -> tuple[Tensor, Tensor]:  # (sums, offsets) per term, (B, H·R, L, ·)
            num, _, offsets = decayed_causal_sums_triton(
                queries, keys, values, scales, g, ctx.chunk, v.dtype
            )
            return num[:, :, 0], offsets[:, :, 0]

        def per_term(x: Tensor) -> Tensor:  # (B, H, L, ·) → (B, H·R, L, ·): a head per term
            return repeat_terms(x.to(acc), rounds)

        g = log_decay.to(acc).reshape(h * rounds, 1)
        # queries [dnum, dden] and keys [v, 1]: a_ij is their product
        d_query = torch.cat([d_num, d_den[..., None]], dim=-1).to(acc)
        d_query = d_query.reshape(b, h * rounds, length, -1)
        v1 = torch.cat([v.to(acc), v.new_ones(b, h, length, 1, dtype=acc)], dim=-1)
        s_t = None if s is None else per_term(s)
        dq = dk = dv = None  # per term, (B, H·R, L, ·)
        if need_q or need_g:
            dq = scan(d_query, per_term(v1), per_term(fk), s_t)[0]
        if need_k or need_v or need_s or need_g:
            # the reversed scans: keys are the queries, with the log-scales −r_i
            s_back = off.to(acc).neg().reshape(b, h * rounds, length).flip(2)
            fq_back, d_back = per_term(fq.flip(2)), d_query.flip(2)  # d_back[..., −1]: dden
            if need_v:
                dv, back = scan(per_term(fk.flip(2)), fq_back, d_back[..., :-1], s_back)
            if need_k or need_s or need_g:
                dk, back = scan(per_term(v1.flip(2)), d_back, fq_back, s_back)
            restore = back.flip(2)  # r'_j, back in order
            if s_t is not None:
                restore = restore + s_t
            restore = restore.exp_()[..., None]  # exp(s_j + r'_j) <= 1
            dv = None if dv is None else dv.flip(2) * restore
            dk = None if dk is None else dk.flip(2) * restore

        def by_term(x: Tensor) -> Tensor:  # (B, H·R, L, ·) → (B, H, R, L, ·)
            return x.view(b, h, rounds, *x.shape[2:])

        ds = None if dk is None else (by_term(dk) * fk.to(acc)[:, :, None]).sum(dim=-1)
        d_gamma = None
        if need_g:  # Σ_i (i − c)(φ(q_i)·dq_i − ds_i), centred for a smaller cancellation
            assert dq is not None and ds is not None
            rho = (by_term(dq) * fq.to(acc)[:, :, None]).sum(dim=-1)  # (B, H, R, L)
            centre = torch.arange(length, dtype=acc, device=v.device) - (length - 1) / 2
            d_gamma = ((rho - ds) * centre).sum(dim=(0, 3)).to(log_decay.dtype)

        def summed(x: Tensor | None, like: Tensor | None, needed: bool) -> Tensor | None:
            """The terms of ``x`` (B, H, R, L, ·) added, in the dtype of ``like``."""
            if x is None or like is None or not needed:
                return None
            return x.sum(dim=2).to(like.dtype)

        dq, dk, dv = (None if x is None else by_term(x) for x in (dq, dk, dv))
        return (
            summed(dq, fq, need_q),
            summed(dk, fk, need_k),
            summed(dv, v, need_v),
            summed(ds, s, need_s),
            d_gamma,
            None,
        )


def _decay_forward(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_alpha: Tensor,
    log_gamma: Tensor,
    k_log_scale: Tensor | None,
    key_padding_mask: Tensor | None,
    *,
    causal: bool,
    eps: float,
    chunk: int,
    kernel_grad: bool = False,
) -> Tensor:
    """The kernel's result; differentiable by :class:`DecayedSums` when ``kernel_grad``."""
    sums = DecayedSums.apply if kernel_grad else decayed_causal_sums_triton
    fk, vals, s = masked_keys(
        phi_k,
        v,
        k_log_scale,
        key_padding_mask,
        log_scales=not causal or key_padding_mask is not None,
    )
    lq = phi_q.shape[2]
    # the recurrences run over positions: the shorter side padded
    fq, fk, vals, s = one_length(phi_q, fk, vals, s)
    acc = accumulation_dtype(v.dtype)
    log_alpha, log_gamma = log_alpha.to(acc), log_gamma.to(acc)
    parts = [(sums(fq, fk, vals, s, log_gamma[:, 0], chunk), 0)]
    if not causal:  # the future side: reversed, keys shifted by one so that j > i strictly
        back = [delayed(x.flip(2), 1) for x in (fk, vals)]
        s_back = None if s is None else delayed(s.flip(2), 1, log_floor(s.dtype))
        num, den, off = sums(fq.flip(2), back[0], back[1], s_back, log_gamma[:, 1], chunk)
        parts.append(((num.flip(3), den.flip(3), off.flip(3)), 1))
    nums, dens, log_ws = [], [], []
    for (num, den, off), side in parts:
        # the future side's query i reads keys from i+1: one more step of decay in its weight
        log_weight = log_alpha[:, side] + (log_gamma[:, side] if side else 0.0)  # (H, R)
        nums.append(num)
        dens.append(den)
        log_ws.append(off + log_weight[None, :, :, None].to(off.device))
    num, den, log_w = (torch.cat(x, dim=2) for x in (nums, dens, log_ws))
    w = torch.exp(log_w - log_w.amax(dim=2, keepdim=True))  # (B, H, sides·R, L)
    num = (num * w[..., None]).sum(dim=2)[:, :, :lq]
    den = (den * w).sum(dim=2)[:, :, :lq, None]
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def decay_linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_alpha: Tensor,
    log_gamma: Tensor,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Kernelized attention weighted by ``c_{j−i} = Σ_r α_r γ_r^{|j−i|}`` by the Triton kernel:
    the result of :func:`kattn.functional.decay_linear_attention`, O(L·R·(C·(M + Dv) + M·Dv)).

    Args:
        phi_q: ``(B, H, Lq, M)``; phi_k: ``(B, H, Lk, M)`` scaled by ``exp(k_log_scale)``
            ``(B, H, Lk)``; v: ``(B, H, Lk, Dv)``.
        log_alpha: ``(H, 2, R)`` log-weights; log_gamma: ``(H, 2, R)`` log-decays (< 0);
            side 0 the past (j <= i), side 1 the future (j > i, unused when causal).
        causal: query i sees keys j <= i (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that count nowhere.
        eps: guard of the normaliser.
        chunk_size: tokens per chunk, a power of two from 16 to 128.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``; gradients by the kernel
        (:class:`DecayedSums`) where :func:`kernel_backward_fits`, else, and for a backward
        with ``create_graph=True``, those of the PyTorch path.

    Raises:
        ValueError: CPU tensors outside Triton's interpreter, mismatched shapes or
            coefficients, causal with Lq != Lk, or a chunk size that is not a power of two
            from 16 to 128.
    """
    s = checked_inputs(phi_q, phi_k, v, k_log_scale)
    check_chunk(chunk_size)
    h, lq = phi_q.shape[1:3]
    terms = log_alpha.shape
    if log_gamma.shape != terms or len(terms) != 3 or terms[:2] != (h, 2):
        raise ValueError(
            f"log_alpha and log_gamma must both be (H, 2, R) with H = {h}, got "
            f"{tuple(log_alpha.shape)} and {tuple(log_gamma.shape)}"
        )
    if causal and lq != phi_k.shape[2]:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={phi_k.shape[2]}")
    tensors = dict(phi_q=phi_q, phi_k=phi_k, v=v, log_alpha=log_alpha, log_gamma=log_gamma,
                   k_log_scale=s, key_padding_mask=key_padding_mask)  # fmt: skip
    fits = kernel_backward_fits(phi_q.shape[-1], v.shape[-1])
    return kernel_with_reference_grad(
        _decay_forward, decay_linear_attention, tensors,
        options=dict(causal=causal, eps=float(eps)), kernel_options=dict(chunk=int(chunk_size)),
        differentiable=partial(_decay_forward, kernel_grad=True) if fits else None,
    )  # fmt: skip
