"""Banded (bucketed) relative positions as Triton kernels: the result of
:func:`kattn.functional.banded_linear_attention`, exact and linear in L.

With log-coefficients ``b`` of the offsets ``−left…right`` that hold for every offset beyond
the ends (T5 buckets past their last boundary), query i sees

* the band ``−left < j − i < right`` with each offset's own coefficient: the windowed kernel
  of :mod:`kattn.ops.triton.rpe_window` over those offsets only, O(L·(left + right)·
  (M + Dv));
* the far left ``j <= i − left`` weighted ``c_L = exp(b_{−left})``: causal linear attention
  over the keys delayed by ``left`` positions (the decayed causal-sums kernel of
  :mod:`kattn.ops.triton.decay` with no decay);
* non-causal, the far right ``j >= i + right`` weighted ``c_R = exp(b_{right})``: the same on
  the reversed sequence, keys delayed by ``right``.

Each part comes with its own per-query log-offset (all weights <= 1 inside it), and the parts
are added in log space, so a large coefficient on one side cancels nothing on another.
Gradients come from the parts' own backward kernels (:mod:`kattn.ops.triton.rpe_window_backward`
for the band, :class:`~kattn.ops.triton.decay.DecayedSums` for the far fields) where the far
fields' fit (:func:`~kattn.ops.triton.decay.kernel_backward_fits`); beyond, and for a backward
with ``create_graph=True``, they are those of the PyTorch path, recomputed. Inputs may
be fp16, bf16, fp32 or fp64; sums are fp32 (fp64 for fp64 inputs); the output has the dtype
of ``v``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ...functional.banded import banded_linear_attention
from ...functional.numerics import (
    DEFAULT_EPS,
    accumulation_dtype,
    delayed,
    guard_normaliser,
    log_floor,
    one_length,
)
from .common import check_chunk, checked_inputs, masked_keys
from .decay import DecayedSums, decayed_causal_sums_triton, kernel_backward_fits
from .recompute import kernel_with_reference_grad
from .rpe_window_backward import window_sums

__all__ = ["banded_linear_attention_triton"]

#: queries per program (band) and tokens per chunk (far field).
DEFAULT_CHUNK = 32


def _far_field(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    delay: int,
    chunk: int,
    kernel_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``num, den, offset`` of ``Σ_{j <= i − delay}`` over sequences of one length T;
    differentiable by :class:`DecayedSums` when ``kernel_grad``."""
    acc = accumulation_dtype(v.dtype)
    keys = delayed(fk, delay), delayed(v, delay)
    s_far = None if s is None else delayed(s, delay, log_floor(acc))
    no_decay = fq.new_zeros(fq.shape[1], 1, dtype=acc)
    sums = DecayedSums.apply if kernel_grad else decayed_causal_sums_triton
    num, den, off = sums(fq, *keys, s_far, no_decay, chunk)
    return num[:, :, 0], den[:, :, 0], off[:, :, 0]


def _banded_forward(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    k_log_scale: Tensor | None,
    key_padding_mask: Tensor | None,
    *,
    left: int,
    causal: bool,
    eps: float,
    chunk: int,
    kernel_grad: bool = False,
) -> Tensor:
    """The kernels' result; differentiable by their own backward when ``kernel_grad``."""
    fk, vals, s = masked_keys(phi_k, v, k_log_scale, key_padding_mask, log_scales=True)
    lq = phi_q.shape[2]
    right = log_coeff.shape[-1] - 1 - left
    log_coeff = log_coeff.to(accumulation_dtype(v.dtype))
    band = (-(left - 1), 0 if causal else right - 1)
    num, den, top = window_sums(
        phi_q, fk, vals, s, log_coeff, left, band, causal=causal, chunk=chunk,
        kernel_grad=kernel_grad,
    )  # fmt: skip
    parts = [(num, den, top)]
    # the far fields run over one length T: queries and keys padded to it
    fq, fk, vals, s = one_length(phi_q, fk, vals, s)
    num, den, off = _far_field(fq, fk, vals, s, left, chunk, kernel_grad)
    parts.append((num[:, :, :lq], den[:, :, :lq], off[:, :, :lq] + log_coeff[:, 0, None]))
    if not causal:  # keys j >= i + right: reversed, they are j' <= i' − right
        s_back = None if s is None else s.flip(2)
        sums = _far_field(fq.flip(2), fk.flip(2), vals.flip(2), s_back, right, chunk, kernel_grad)
        num, den, off = (x.flip(2)[:, :, :lq] for x in sums)
        parts.append((num, den, off + log_coeff[:, -1, None]))
    tops = torch.stack([p[2] for p in parts])  # (parts, B, H, Lq)
    w = torch.exp(tops - tops.amax(dim=0, keepdim=True))
    num = sum(p[0] * wp[..., None] for p, wp in zip(parts, w, strict=True))
    den = sum(p[1] * wp for p, wp in zip(parts, w, strict=True))
    assert isinstance(num, Tensor) and isinstance(den, Tensor)
    return (num / guard_normaliser(den[..., None], eps)).to(v.dtype)


def banded_linear_attention_triton(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    left: int,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Kernelized attention with positional weights constant beyond a band, exact, by the
    Triton kernels: the result of :func:`kattn.functional.banded_linear_attention`.

    Args:
        phi_q: ``(B, H, Lq, M)``; phi_k: ``(B, H, Lk, M)`` scaled by ``exp(k_log_scale)``
            ``(B, H, Lk)``; v: ``(B, H, Lk, Dv)``.
        log_coeff: ``(H, left + right + 1)`` log-coefficients of offsets ``−left…right``; the
            ends hold for all offsets beyond.
        left: ``>= 1``, see ``log_coeff`` (``right >= 1`` too).
        causal: query i sees keys j <= i (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that count nowhere.
        eps: guard of the normaliser.
        chunk_size: queries per program of the band and tokens per chunk of the far field, a
            power of two from 16 to 128.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``; gradients by the kernels' own backward
        where the far fields' fits (:func:`~kattn.ops.triton.decay.kernel_backward_fits`),
        else, and for a backward with ``create_graph=True``, those of the PyTorch path.

    Raises:
        ValueError: CPU tensors outside Triton's interpreter, mismatched shapes, a band
            without ``left, right >= 1``, causal with Lq != Lk, or a chunk size that is not a
            power of two from 16 to 128.
    """
    s = checked_inputs(phi_q, phi_k, v, k_log_scale)
    check_chunk(chunk_size)
    h, lq = phi_q.shape[1:3]
    if log_coeff.dim() != 2 or log_coeff.shape[0] != h:
        raise ValueError(
            f"log_coeff must be (H, left + right + 1) with H = {h}, got {tuple(log_coeff.shape)}"
        )
    right = log_coeff.shape[-1] - 1 - left
    if left < 1 or right < 1:
        raise ValueError(f"the band needs left >= 1 and right >= 1, got {left} and {right}")
    if causal and lq != phi_k.shape[2]:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={phi_k.shape[2]}")
    tensors = dict(phi_q=phi_q, phi_k=phi_k, v=v, log_coeff=log_coeff, k_log_scale=s,
                   key_padding_mask=key_padding_mask)  # fmt: skip
    fits = kernel_backward_fits(phi_q.shape[-1], v.shape[-1])
    return kernel_with_reference_grad(
        _banded_forward, banded_linear_attention, tensors,
        options=dict(left=int(left), causal=causal, eps=float(eps)),
        kernel_options=dict(chunk=int(chunk_size)),
        differentiable=partial(_banded_forward, kernel_grad=True) if fits else None,
    )  # fmt: skip
