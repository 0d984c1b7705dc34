"""Causal linear attention as a Triton kernel: the chunkwise form of
:func:`kattn.functional.linear_attention_chunked` (Katharopoulos et al. 2020, §3.2; the
chunked prefix-state form of Hua et al. 2022 and FLA), one program per (batch, head).

``out_i = φ(q_i)·S_i / guard(φ(q_i)·z_i)`` with ``S_i = Σ_{j≤i} φ(k_j) v_jᵀ`` and
``z_i = Σ_{j≤i} φ(k_j)``: each program walks its sequence a chunk of ``C`` tokens at a time,
computing the masked ``C×C`` products inside the chunk and reading the prefix state (``S``,
``z``, fp32) for the tokens before it, then adding the chunk to the state. Inputs may be
fp16, bf16 or fp32; sums are fp32; the output has the dtype of ``v``.

The kernel runs on CUDA tensors, or on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported), which is how it is tested on
machines without a GPU. The backward is, for now, that of the PyTorch chunked path
(recomputed), so gradients are exact but not fast. Triton is an optional dependency
(``pip install 'kattn[gpu]'``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from ...functional.linear_causal import linear_attention_chunked
from ...functional.numerics import DEFAULT_EPS

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised where triton is absent
    raise ImportError(
        "the Triton kernels need triton: pip install 'kattn[gpu]' (or pip install triton)"
    ) from error

__all__ = ["causal_linear_attention_triton", "interpreted"]

#: tokens per chunk of the kernel.
DEFAULT_CHUNK = 32


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _causal_linear_forward(
    q_ptr, k_ptr, v_ptr, o_ptr, length, m, dv, eps,
    C: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)  # B·H·L·M may pass 2³¹
    q_ptr += seq * length * m
    k_ptr += seq * length * m
    v_ptr += seq * length * dv
    o_ptr += seq * length * dv
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    rows = tl.arange(0, C)
    state = tl.zeros((BM, BDV), dtype=tl.float32)
    total = tl.zeros((BM,), dtype=tl.float32)
    for start in range(0, length, C):
        pos = start + rows
        inside = pos < length
        fm = inside[:, None] & (cols_m[None, :] < m)
        fv = inside[:, None] & (cols_v[None, :] < dv)
        q = tl.load(q_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + pos[:, None] * m + cols_m[None, :], mask=fm, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + pos[:, None] * dv + cols_v[None, :], mask=fv, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
        num = tl.dot(scores, v, input_precision="ieee") + tl.dot(q, state, input_precision="ieee")
        den = tl.sum(scores, axis=1) + tl.sum(q * total[None, :], axis=1)
        den = tl.where(den >= 0, tl.maximum(den, eps), tl.minimum(den, -eps))
        out = num / den[:, None]
        tl.store(o_ptr + pos[:, None] * dv + cols_v[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=fv)  # fmt: skip
        state += tl.dot(tl.trans(k), v, input_precision="ieee")
        total += tl.sum(k, axis=0)


def _forward(fq: Tensor, fk: Tensor, v: Tensor, eps: float, chunk: int) -> Tensor:
    b, h, length, m = fq.shape
    dv = v.shape[-1]
    fq, fk, v = (x.contiguous() for x in (fq, fk, v))
    out = torch.empty(b, h, length, dv, dtype=v.dtype, device=v.device)
    if out.numel() == 0:
        return out
    block_m = max(16, triton.next_power_of_2(m))
    block_v = max(16, triton.next_power_of_2(dv))
    _causal_linear_forward[(b * h,)](fq, fk, v, out, length, m, dv, eps,
                                     C=chunk, BM=block_m, BDV=block_v)  # fmt: skip
    return out


class _CausalLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fq: Tensor, fk: Tensor, v: Tensor, eps: float, chunk: int) -> Tensor:
        ctx.save_for_backward(fq, fk, v)
        ctx.eps = eps
        return _forward(fq, fk, v, eps, chunk)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        fq, fk, v = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_(x.requires_grad) for x in (fq, fk, v)]
            out = linear_attention_chunked(*inputs, eps=ctx.eps)
            wanted = [x for x in inputs if x.requires_grad]
            found = iter(torch.autograd.grad(out, wanted, grad))
        grads = [next(found) if x.requires_grad else None for x in inputs]
        return grads[0], grads[1], grads[2], None, None


def causal_linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Causal linear attention of features ``phi_q``, ``phi_k`` ``(B, H, L, M)`` and values
    ``v`` ``(B, H, L, Dv)`` by the Triton kernel; the same result as
    :func:`kattn.functional.linear_attention_chunked` (key log-scales are not supported yet).

    Args:
        key_padding_mask: ``(B, L)`` bool, True marks padding: those keys and values count
            nowhere (zeroed before the kernel, so not even a NaN there reaches an output).
        eps: guard of the normaliser (``|den| ≥ eps``, sign kept).
        chunk_size: tokens per chunk, a power of two of at least 16.

    Raises:
        ValueError: tensors on the CPU outside the interpreter, mismatched shapes, or a chunk
            size that is not a power of two ≥ 16.
    """
    if v.device.type == "cpu" and not interpreted():
        raise ValueError(
            "the Triton kernel runs on CUDA tensors, or on CPU tensors with TRITON_INTERPRET=1 "
            "set before kattn.ops.triton is imported; use the PyTorch path on the CPU"
        )
    if phi_q.shape != phi_k.shape or phi_q.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"phi_q, phi_k must be (B, H, L, M) and v (B, H, L, Dv) alike, got "
            f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}"
        )
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two of at least 16, got {chunk_size}")
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :, None]
        phi_k, v = phi_k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
    out: Tensor = _CausalLinear.apply(phi_q, phi_k, v, float(eps), int(chunk_size))
    return out
