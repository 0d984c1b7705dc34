"""Exact Gaussian-kernel attention (Skyformer's "kernelized attention", seed 003 eq. 3).

``out = κ(Q/p^¼, K/p^¼) V`` with ``κ(x, y) = exp(−‖x − y‖²/2)`` and p the head dim, **without
row normalisation** (the paper's "automatic normalisation": the kernel is the softmax
numerator scaled by ``exp(−‖q‖²/2√p) exp(−‖k‖²/2√p)``). Every exponent is ``<= 0``, so nothing
overflows whatever the norms.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .masks import allowed_keys
from .numerics import accumulation_dtype


def gaussian_kernel(x: Tensor, y: Tensor) -> Tensor:
    """``exp(−‖x_i − y_j‖²/2)`` for ``x (..., Lx, D)`` and ``y (..., Ly, D)``: ``(..., Lx, Ly)``,
    as ``exp(x·y − ‖x‖²/2 − ‖y‖²/2)`` with the exponent clamped to ``<= 0`` (it is, up to
    rounding)."""
    logits = x @ y.transpose(-1, -2)
    logits = logits - 0.5 * x.square().sum(dim=-1, keepdim=True)
    logits = logits - 0.5 * y.square().sum(dim=-1)[..., None, :]
    return torch.exp(logits.clamp(max=0.0))


def gaussian_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``κ(Q/p^¼, K/p^¼) V`` with padded keys and (if ``causal``) future keys removed.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        dropout_p: dropout on the kernel entries (training only; the caller decides).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    out_dtype, acc = v.dtype, accumulation_dtype(v.dtype)
    scale = q.shape[-1] ** -0.25
    kernel = gaussian_kernel(q.to(acc) * scale, k.to(acc) * scale)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    if dropout_p > 0:
        kernel = torch.nn.functional.dropout(kernel, p=dropout_p)
    v = v.to(acc)
    if key_padding_mask is not None:  # so that not even a non-finite padded value leaks
        v = v.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    return (kernel @ v).to(out_dtype)


def gaussian_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_padding_mask: Tensor | None = None
) -> Tensor:
    """The definition, with explicit pairwise distances (slow; for tests)."""
    acc = accumulation_dtype(v.dtype)
    scale = q.shape[-1] ** -0.25
    dist2 = torch.cdist(q.to(acc) * scale, k.to(acc) * scale).square()
    kernel = torch.exp(-0.5 * dist2)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    return (kernel @ v.to(acc)).to(v.dtype)
