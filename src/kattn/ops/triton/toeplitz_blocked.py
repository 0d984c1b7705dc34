"""Exact Toeplitz relative positions (Luo et al. 2021) as a Triton kernel: the blocked form of
:func:`kattn.functional.rpe_linear_attention_blocked` with :class:`ToeplitzRows`.

The windowed sums of :mod:`kattn.ops.triton.rpe_window` over every offset, flash-attention
style: a block of queries walks its keys with a running maximum, O(Lq·Lk·(M + Dv)) time (half
when causal), O(L·(M + Dv)) memory, no weight above 1. Gradients by the kernels of
:mod:`kattn.ops.triton.rpe_window_backward` (the same order of time and memory); for a
backward with ``create_graph=True``, those of the PyTorch blocked path, recomputed. Inputs may
be fp16, bf16, fp32 or fp64; sums are fp32 (fp64 for fp64 inputs); the output has the dtype of
``v``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor

from ...functional.numerics import DEFAULT_EPS, guard_normaliser
from ...functional.rpe_blocked import ToeplitzRows, rpe_linear_attention_blocked
from .common import check_chunk, checked_inputs, masked_keys
from .recompute import kernel_with_reference_grad
from .rpe_window import DEFAULT_BLOCK
from .rpe_window_backward import window_sums

__all__ = ["toeplitz_linear_attention_triton"]


def _toeplitz_forward(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    k_log_scale: Tensor | None,
    key_padding_mask: Tensor | None,
    *,
    causal: bool,
    eps: float,
    chunk: int,
    kernel_grad: bool = False,
) -> Tensor:
    """The kernel's result; differentiable by the window sums' kernels when ``kernel_grad``."""
    fk, vals, s = masked_keys(
        phi_k, v, k_log_scale, key_padding_mask, log_scales=key_padding_mask is not None
    )
    lq, lk = phi_q.shape[2], fk.shape[2]
    window = (-(lq - 1), lk - 1)
    num, den, _ = window_sums(
        phi_q, fk, vals, s, log_coeff, lq - 1, window, causal=causal, chunk=chunk,
        kernel_grad=kernel_grad,
    )  # fmt: skip
    return (num / guard_normaliser(den[..., None], eps)).to(v.dtype)


def _toeplitz_reference(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, log_coeff: Tensor, **options: Any
) -> Tensor:
    """The PyTorch blocked path with the rows of these log-coefficients."""
    rows = ToeplitzRows(log_coeff, phi_q.shape[2])
    return rpe_linear_attention_blocked(phi_q, phi_k, v, rows, **options)


def toeplitz_linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    block_size: int = DEFAULT_BLOCK,
) -> Tensor:
    """Exact kernelized attention with Toeplitz positional weights ``c_{j−i} = exp(b_{j−i})``
    by the Triton kernel: the result of :func:`kattn.functional.rpe_linear_attention_blocked`
    with ``ToeplitzRows(log_coeff, Lq)``.

    Args:
        phi_q: ``(B, H, Lq, M)``; phi_k: ``(B, H, Lk, M)`` scaled by ``exp(k_log_scale)``
            ``(B, H, Lk)``; v: ``(B, H, Lk, Dv)``.
        log_coeff: ``(H, Lq + Lk − 1)`` log-coefficients of offsets ``−(Lq−1)…Lk−1``.
        causal: query i sees keys j <= i (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that count nowhere.
        eps: guard of the normaliser (in units of each row's largest weight).
        block_size: queries per program and keys per step, a power of two from 16 to 128.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``; rows that see no key give 0; gradients by
        the kernels of :mod:`kattn.ops.triton.rpe_window_backward` (for a backward with
        ``create_graph=True``, those of the PyTorch blocked path).

    Raises:
        ValueError: CPU tensors outside Triton's interpreter, mismatched shapes or
            coefficients, causal with Lq != Lk, or a block size that is not a power of two
            from 16 to 128.
    """
    s = checked_inputs(phi_q, phi_k, v, k_log_scale)
    check_chunk(block_size, "block_size")
    h, lq = phi_q.shape[1:3]
    lk = phi_k.shape[2]
    if log_coeff.shape != (h, lq + lk - 1):
        raise ValueError(
            f"log_coeff must be (H, Lq + Lk − 1) = ({h}, {lq + lk - 1}), got "
            f"{tuple(log_coeff.shape)}"
        )
    if causal and lq != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
    tensors = dict(phi_q=phi_q, phi_k=phi_k, v=v, log_coeff=log_coeff, k_log_scale=s,
                   key_padding_mask=key_padding_mask)  # fmt: skip
    return kernel_with_reference_grad(
        _toeplitz_forward, _toeplitz_reference, tensors,
        options=dict(causal=causal, eps=float(eps)), kernel_options=dict(chunk=int(block_size)),
        differentiable=partial(_toeplitz_forward, kernel_grad=True),
    )  # fmt: skip
