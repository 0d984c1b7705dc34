"""One decoding step of causal linear attention as a Triton kernel: the state update and the
output of :func:`kattn.functional.linear_attention_step`, one program per (batch, head).

With the state ``(S, z, r)`` after t tokens (sums in the units of the running offset r) and
the new token's features, value and key log-scale ``s`` (0 without log-scales):
``r' = max(r, s)``, ``S' = e^{r−r'} S + e^{s−r'} φ(k) vᵀ``, ``z' = e^{r−r'} z + e^{s−r'} φ(k)``
and ``out = φ(q)·S' / guard(φ(q)·z')``: O(M·Dv) whatever the position (Katharopoulos et al.
2020, §3.4). Decoding is bound by the passes over the ``(M, Dv)`` state, which the kernel
makes once: it reads the state and writes the new one in place when it may (as the PyTorch
step does without a graph; to branch, clone the state first).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...functional.linear_causal import LinearState, checked_state
from ...functional.numerics import DEFAULT_EPS, accumulation_dtype
from .common import acc_type, block, guard, tl, triton
from .placement import check_device

__all__ = ["linear_step_triton"]


@triton.jit
def _linear_step(
    q_ptr, k_ptr, v_ptr, s_ptr, kv_ptr, z_ptr, off_ptr, o_ptr, kv1_ptr, z1_ptr, off1_ptr,
    m, dv, eps,
    BM: tl.constexpr, BDV: tl.constexpr, HAS_S: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    cols_m = tl.arange(0, BM)
    cols_v = tl.arange(0, BDV)
    in_m = cols_m < m
    in_v = cols_v < dv
    in_state = in_m[:, None] & in_v[None, :]
    at = seq * m * dv + cols_m[:, None] * dv + cols_v[None, :]
    q = tl.load(q_ptr + seq * m + cols_m, mask=in_m, other=0.0).to(ACC)
    k = tl.load(k_ptr + seq * m + cols_m, mask=in_m, other=0.0).to(ACC)
    v = tl.load(v_ptr + seq * dv + cols_v, mask=in_v, other=0.0).to(ACC)
    kv = tl.load(kv_ptr + at, mask=in_state, other=0.0).to(ACC)
    z = tl.load(z_ptr + seq * m + cols_m, mask=in_m, other=0.0).to(ACC)
    offset = tl.load(off_ptr + seq).to(ACC)
    s = tl.load(s_ptr + seq).to(ACC) if HAS_S else 0.0  # no log-scales: 0
    new_offset = tl.maximum(offset, s)
    decay = tl.exp(tl.minimum(offset - new_offset, 0.0))
    k_in = k * tl.exp(tl.minimum(s - new_offset, 0.0))
    kv = kv * decay + k_in[:, None] * v[None, :]
    z = z * decay + k_in
    num = tl.sum(q[:, None] * kv, axis=0)  # (BDV,)
    den = tl.sum(q * z, axis=0)
    out = num / guard(den, eps)
    tl.store(o_ptr + seq * dv + cols_v, out.to(o_ptr.dtype.element_ty), mask=in_v)
    tl.store(kv1_ptr + at, kv.to(kv1_ptr.dtype.element_ty), mask=in_state)
    tl.store(z1_ptr + seq * m + cols_m, z.to(z1_ptr.dtype.element_ty), mask=in_m)
    tl.store(off1_ptr + seq, new_offset.to(off1_ptr.dtype.element_ty))


def linear_step_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState,
    *,
    k_log_scale: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """One causal step by the Triton kernel: the output and state of
    :func:`kattn.functional.linear_attention_step`.

    Args:
        phi_q, phi_k: ``(B, H, 1, M)``; v: ``(B, H, 1, Dv)``; k_log_scale: ``(B, H, 1)``.
        state: the state after the previous tokens (from ``init_state``, a prefill or a step);
            its sums are updated in place when they are contiguous and outside any graph.
        eps: guard of the normaliser.

    Returns:
        The output ``(B, H, 1, Dv)`` in the dtype of ``v`` and the state including this token.

    Raises:
        ValueError: tensors on the CPU outside the interpreter, or shapes that do not match.
        NotImplementedError: a gradient is needed (the kernel has no backward).
    """
    check_device(v)
    b, h, length, m = phi_q.shape
    if length != 1 or phi_k.shape != phi_q.shape or v.shape[:3] != (b, h, 1):
        raise ValueError(
            f"a step takes phi_q, phi_k (B, H, 1, M) and v (B, H, 1, Dv), got "
            f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}"
        )
    if k_log_scale is not None and k_log_scale.shape != (b, h, 1):
        raise ValueError(f"k_log_scale must be (B, H, 1), got {tuple(k_log_scale.shape)}")
    tensors = (phi_q, phi_k, v, k_log_scale, *state)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors):
        raise NotImplementedError(
            "the Triton decoding step has no backward: step under torch.no_grad(), or use "
            "backend='torch' to train through steps"
        )
    acc = accumulation_dtype(v.dtype)
    dv = v.shape[-1]
    kv, z, offset = checked_state(state, phi_k, dv, acc)
    out = torch.empty(b, h, 1, dv, dtype=v.dtype, device=v.device)
    # the sums are overwritten where they may be; the offset is always a new tensor
    new = LinearState(_output_for(kv), _output_for(z), torch.empty_like(offset))
    if out.numel():
        _linear_step[(b * h,)](
            phi_q.contiguous(), phi_k.contiguous(), v.contiguous(),
            phi_q if k_log_scale is None else k_log_scale.contiguous(),
            kv.contiguous(), z.contiguous(), offset.contiguous(), out, *new,
            m, dv, float(eps),
            BM=block(m), BDV=block(dv), HAS_S=k_log_scale is not None, ACC=acc_type(v.dtype),
        )  # fmt: skip
    return out, new


def _output_for(x: Tensor) -> Tensor:
    """``x`` itself when the kernel may overwrite it (contiguous, no leaf of a graph, no
    inference tensor outside inference mode: the rule of the PyTorch step), else a new
    tensor like it."""
    writable = (
        x.is_contiguous()
        and not x.requires_grad
        and (torch.is_inference_mode_enabled() or not x.is_inference())
    )
    return x if writable else torch.empty_like(x, memory_format=torch.contiguous_format)
