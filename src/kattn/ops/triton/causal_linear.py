"""Causal linear attention as a Triton kernel: the chunkwise form of
:func:`kattn.functional.linear_attention_chunked` (Katharopoulos et al. 2020, §3.2; the
chunked prefix-state form of Hua et al. 2022 and FLA), one program per (batch, head) and
block of value columns.

``out_i = φ(q_i)·S_i / guard(φ(q_i)·z_i)`` with ``S_i = Σ_{j≤i} w_ij φ(k_j) v_jᵀ`` and
``z_i = Σ_{j≤i} w_ij φ(k_j)``: each program walks its sequence a chunk of ``C`` tokens at a
time, computing the masked ``C×C`` products inside the chunk and reading the prefix state
(``S``, ``z``) for the tokens before it, then adding the chunk to the state. With key
log-scales ``s_j`` (the bounded form of positive random features, see
:mod:`kattn.functional.linear`) the weights are ``w_ij = exp(s_j − r_i)`` with ``r_i`` the
running maximum of the log-scales up to i, so no offset looks at a later key and no weight
exceeds 1; without them every ``w_ij = 1``. Inputs may be fp16, bf16, fp32 (sums in fp32) or
fp64 (sums in fp64); the output has the dtype of ``v``.

The backward is the kernels of :mod:`kattn.ops.triton.linear_backward`. The kernel runs on
CUDA tensors, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1`` set before
triton is imported), which is how it is tested on machines without a GPU. Triton is an
optional dependency (``pip install 'kattn[gpu]'``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...functional.linear_causal import LinearState, checked_state
from ...functional.numerics import DEFAULT_EPS, accumulation_dtype
from .common import (
    SCAN_STAGES,
    acc_type,
    check_chunk,
    checked_inputs,
    dot_precision,
    guard,
    masked_keys,
    running_offsets,
    scan_tiles,
    tl,
    triton,
)
from .linear_backward import causal_backward
from .recompute import linear_reference_grads

__all__ = [
    "DEFAULT_CHUNK",
    "causal_linear_attention_triton",
    "causal_linear_prefill_triton",
]

#: tokens per chunk of the kernel.
DEFAULT_CHUNK = 32
#: most value columns one program holds (wider values are split across programs).
MAX_VALUE_BLOCK = 64


@triton.jit
def _causal_linear_forward(
    q_ptr, k_ptr, v_ptr, s_ptr, r_ptr, kv0_ptr, z0_ptr, off0_ptr,
    o_ptr, den_ptr, kv1_ptr, z1_ptr,
    length, m, dv, eps,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, HAS_S: tl.constexpr,
    HAS_INIT: tl.constexpr, STORE_STATE: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)  # B·H·L·M may pass 2³¹
    vb = tl.program_id(1)
    q_ptr += seq * length * m
    k_ptr += seq * length * m
    v_ptr += seq * length * dv
    o_ptr += seq * length * dv
    s_ptr += seq * length
    r_ptr += seq * length
    den_ptr += seq * length
    cols_m = tl.arange(0, BM)
    cols_v = vb * BDV + tl.arange(0, BDV)
    rows = tl.arange(0, C)
    causal = rows[:, None] >= rows[None, :]
    state_at = cols_m[:, None] * dv + cols_v[None, :]
    state_in = (cols_m[:, None] < m) & (cols_v[None, :] < dv)
    if HAS_INIT:
        state = tl.load(kv0_ptr + seq * m * dv + state_at, mask=state_in, other=0.0).to(ACC)
        total = tl.load(z0_ptr + seq * m + cols_m, mask=cols_m < m, other=0.0).to(ACC)
        offset = tl.load(off0_ptr + seq).to(ACC)
    else:
        state = tl.zeros((BM, BDV), dtype=ACC)
        total = tl.zeros((BM,), dtype=ACC)
        offset = tl.load(r_ptr).to(ACC)  # any value will do while the state is 0
    for start in range(0, length, C):
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        q = tl.load(q_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        k = tl.load(k_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(ACC)
        v = tl.load(v_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(ACC)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (C, C)
        if HAS_S:
            s = tl.load(s_ptr + pos, mask=inside, other=0.0).to(ACC)
            r = tl.load(r_ptr + pos, mask=inside, other=0.0).to(ACC)
            r_end = tl.load(r_ptr + tl.minimum(start + C, length) - 1).to(ACC)
            # every exponent is <= 0: s_j <= r_i for j <= i, and offsets only grow
            weights = tl.exp(tl.minimum(s[None, :] - r[:, None], 0.0))
            scores = tl.where(causal, scores * weights, 0.0)
            q_scale = tl.exp(tl.minimum(offset - r, 0.0))
            k_scale = tl.exp(tl.minimum(s - r_end, 0.0))
            decay = tl.exp(tl.minimum(offset - r_end, 0.0))
            offset = r_end
        else:
            scores = tl.where(causal, scores, 0.0)
            q_scale = tl.full((C,), 1.0, ACC)
            k_scale = tl.full((C,), 1.0, ACC)
            decay = 1.0
        num = tl.dot(scores, v, input_precision=PRECISION)
        num += q_scale[:, None] * tl.dot(q, state, input_precision=PRECISION)
        den = tl.sum(scores, axis=1) + q_scale * tl.sum(q * total[None, :], axis=1)
        out = num / guard(den, eps)[:, None]
        tl.store(o_ptr + pos[:, None] * dv + cols_v[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=fv)  # fmt: skip
        if vb == 0:
            tl.store(den_ptr + pos, den.to(den_ptr.dtype.element_ty), mask=inside)
        k_in = k * k_scale[:, None]
        state = state * decay + tl.dot(tl.trans(k_in), v, input_precision=PRECISION)
        total = total * decay + tl.sum(k_in, axis=0)
    if STORE_STATE:
        tl.store(kv1_ptr + seq * m * dv + state_at, state, mask=state_in)
        if vb == 0:
            tl.store(z1_ptr + seq * m + cols_m, total, mask=cols_m < m)


def _launch(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    r: Tensor | None,
    eps: float,
    chunk: int,
    state: LinearState | None = None,
) -> tuple[Tensor, Tensor, LinearState | None]:
    """Run the forward kernel: the output ``(B, H, L, Dv)``, the raw normalisers
    ``(B, H, L)`` and, when ``state`` is given (it is read as the state before the tokens),
    the state after them (its offset ``r`` at the last token)."""
    b, h, length, m = fq.shape
    dv = v.shape[-1]
    acc = accumulation_dtype(v.dtype)
    fq = fq.contiguous()
    out = torch.empty(b, h, length, dv, dtype=v.dtype, device=v.device)
    den = torch.empty(b, h, length, dtype=acc, device=v.device)
    if out.numel() == 0:  # no token (or no value column): the state is unchanged
        return out, den, state
    final = None
    if state is not None:
        assert r is not None, "a given state needs the running offsets"
        final = LinearState(torch.empty_like(state.kv), torch.empty_like(state.k_sum), r[..., -1])
    init = state if state is not None else (den, den, den)  # unread unless HAS_INIT
    ends = final if final is not None else (den, den)
    c, block_m, block_v = scan_tiles(m, dv, chunk, MAX_VALUE_BLOCK)
    grid = (b * h, triton.cdiv(dv, block_v))
    _causal_linear_forward[grid](
        fq, fk, v, fq if s is None else s, fq if r is None else r, *init[:3],
        out, den, *ends[:2],
        length, m, dv, eps,
        C=c, BM=block_m, BDV=block_v, HAS_S=s is not None, HAS_INIT=state is not None,
        STORE_STATE=state is not None, ACC=acc_type(v.dtype), PRECISION=dot_precision(v.dtype),
        num_stages=SCAN_STAGES,
    )  # fmt: skip
    return out, den, final


class _CausalLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, fq: Tensor, fk: Tensor, v: Tensor, s: Tensor | None, eps: float, chunk: int
    ) -> Tensor:
        r = None if s is None else running_offsets(s)
        out, den, _ = _launch(fq, fk, v, s, r, eps, chunk)
        ctx.save_for_backward(fq, fk, v, s, r, out, den)
        ctx.eps, ctx.chunk = eps, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        fq, fk, v, s, r, out, den = ctx.saved_tensors
        if torch.is_grad_enabled():  # backward(create_graph=True): the PyTorch path's graph
            wanted = tuple(ctx.needs_input_grad[:4])
            grads = linear_reference_grads((fq, fk, v, s), wanted, grad, causal=True, eps=ctx.eps)
            return (*grads, None, None)
        dq, dk, dv, ds = causal_backward(fq, fk, v, s, r, out, den, grad, ctx.eps, ctx.chunk)
        return dq, dk, dv, ds, None, None


def _checked(phi_q: Tensor, phi_k: Tensor, v: Tensor, k_log_scale: Tensor | None, chunk: int):
    """Refuse what the kernel does not take (:func:`~.common.checked_inputs`, Lq != Lk, the
    chunk size); the log-scales in the accumulation dtype."""
    s = checked_inputs(phi_q, phi_k, v, k_log_scale)
    check_chunk(chunk)
    if phi_q.shape[2] != phi_k.shape[2]:
        raise ValueError(
            f"causal attention needs Lq == Lk, got Lq={phi_q.shape[2]}, Lk={phi_k.shape[2]}"
        )
    return s


def causal_linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Causal linear attention of features ``phi_q``, ``phi_k`` ``(B, H, L, M)`` and values
    ``v`` ``(B, H, L, Dv)`` by the Triton kernels, forward and backward: the result of
    :func:`kattn.functional.linear_attention_chunked`, O(L·C·(M+Dv) + L·M·Dv) time and
    O(M·Dv) state per program.

    Args:
        k_log_scale: ``(B, H, L)`` key log-scales (``φ(k_j) = phi_k_j·exp(s_j)``) or None;
            query j uses the offset ``max_{i≤j} s_i``, which never looks at a later key.
        key_padding_mask: ``(B, L)`` bool, True marks padding: those keys and values count
            nowhere (zeroed before the kernel, so not even a NaN there reaches an output).
        eps: guard of the normaliser (``|den| ≥ eps``, sign kept).
        chunk_size: tokens per chunk, a power of two from 16 to 128.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of ``v``.

    Raises:
        ValueError: tensors on the CPU outside the interpreter, mismatched shapes, or a chunk
            size the kernel does not take.
    """
    s = _checked(phi_q, phi_k, v, k_log_scale, chunk_size)
    fk, v, s = masked_keys(phi_k, v, s, key_padding_mask)
    out: Tensor = _CausalLinear.apply(phi_q.contiguous(), fk, v, s, float(eps), chunk_size)
    return out


def causal_linear_prefill_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[Tensor, LinearState]:
    """Causal linear attention over L tokens that follow ``state`` by the forward kernel, and
    the state after them: :func:`kattn.functional.linear_attention_prefill` without a graph
    (prompt processing before decoding). Shapes and arguments as
    :func:`causal_linear_attention_triton`.

    Raises:
        NotImplementedError: a gradient is needed (no backward through a given state).
    """
    s = _checked(phi_q, phi_k, v, k_log_scale, chunk_size)
    if torch.is_grad_enabled() and any(
        x.requires_grad for x in (phi_q, phi_k, v, s, *state) if x is not None
    ):
        raise NotImplementedError(
            "the Triton prefill has no backward: run it under torch.no_grad(), or use "
            "backend='torch' to train through a prefill"
        )
    acc = accumulation_dtype(v.dtype)
    if s is None:
        # a given state may carry any offset: these keys get log-scales 0, as in the PyTorch path
        s = phi_k.new_zeros(phi_k.shape[:3], dtype=acc)
    fk, v, s = masked_keys(phi_k, v, s, key_padding_mask)
    assert s is not None
    state = checked_state(state, fk, v.shape[-1], acc)
    state = LinearState(*(x.contiguous() for x in state))
    r = running_offsets(s, state.offset)
    out, _, final = _launch(phi_q, fk, v, s, r, float(eps), chunk_size, state)
    assert final is not None
    return out, final
