"""Exact Gaussian-kernel attention (Skyformer's "kernelized attention", Chen et al. 2021 eq. 3).

``out = κ(Q/p^¼, K/p^¼) V`` with ``κ(x, y) = exp(−‖x − y‖²/2)`` and p the head dim, **without
row normalisation** (the paper's "automatic normalisation": the kernel is the softmax
numerator scaled by ``exp(−‖q‖²/2√p) exp(−‖k‖²/2√p)``). Every exponent is ``<= 0``, so nothing
overflows whatever the norms.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .masks import allowed_keys
from .numerics import (
    accumulation_dtype,
    autocast_off,
    exp_nonpositive_,
    without_autocast,
    zero_padded,
)

#: Entries of the kernel weighted at a time in the CPU backward of :func:`gaussian_product`
#: (1 MiB in fp32), in at most :data:`WEIGHT_MAX_BLOCKS` blocks.
WEIGHT_BLOCK_ENTRIES = 1 << 18
WEIGHT_MAX_BLOCKS = 8


def gaussian_kernel(x: Tensor, y: Tensor, *, scale: float = 1.0) -> Tensor:
    """``κ(s·x_i, s·y_j) = exp(−s²‖x_i − y_j‖²/2)`` for ``x (..., Lx, D)`` and ``y (..., Ly, D)``:
    ``(..., Lx, Ly)`` (batch dims broadcast; s = ``scale``, ``p^-¼`` for attention).

    Computed as ``exp(s²(x·y − ‖x‖²/2 − ‖y‖²/2))`` with the exponent clamped to
    ``[exp_floor(dtype), 0]`` (it is ``<= 0`` up to rounding; entries below the smallest normal
    number of the dtype, e.g. ``e^-86`` in fp32, are raised to it: no entry is subnormal, which
    CPUs process many times slower), in one matrix product and two in-place passes, outside
    autocast (in the dtype of the inputs). The backward pass is written out
    (``∂κ_ij/∂x_i = s²κ_ij (y_j − x_i)``, using the entry as computed, so a floored entry
    contributes ``s²·tiny·(y_j − x_i)``), and nothing of the size of the kernel is kept but
    the kernel itself. Once differentiable (no double backward).
    """
    batch, (x, y) = _flatten("x (..., Lx, D) and y (..., Ly, D)", x, y)
    out = _GaussianKernel.apply(x, y, float(scale) ** 2)
    return out.reshape(*batch, x.shape[-2], y.shape[-2])


def _flatten(what: str, *tensors: Tensor) -> tuple[tuple[int, ...], list[Tensor]]:
    """Broadcast the batch dims of ``tensors`` (all ``(..., rows, cols)``) and flatten them to
    one: the batch shape and the 3-D tensors."""
    if any(t.dim() < 2 for t in tensors) or tensors[0].shape[-1] != tensors[1].shape[-1]:
        raise ValueError(
            f"{what} must share D, got " + ", ".join(str(tuple(t.shape)) for t in tensors)
        )
    try:
        batch = tuple(torch.broadcast_shapes(*(t.shape[:-2] for t in tensors)))
    except RuntimeError as error:
        raise ValueError(f"{what}: batch dims do not broadcast ({error})") from None
    n = math.prod(batch)
    return batch, [t.expand(*batch, *t.shape[-2:]).reshape(n, *t.shape[-2:]) for t in tensors]


def _kernel(x: Tensor, y: Tensor, s2: float) -> Tensor:
    """``κ(s·x, s·y)`` (``s2 = s²``) of 3-D ``x (N, Lx, D)``, ``y (N, Ly, D)`` in one product and
    two in-place passes: ``[x, −½‖x‖², 1] · [s²y, s², −½s²‖y‖²]`` is the exponent (the scale
    is applied on the y side only, so x is never rescaled)."""
    half_x = -0.5 * x.square().sum(dim=-1, keepdim=True)  # (N, Lx, 1)
    half_y = (-0.5 * s2) * y.square().sum(dim=-1, keepdim=True)  # (N, Ly, 1)
    x_aug = torch.cat([x, half_x, torch.ones_like(half_x)], dim=-1)
    y_aug = torch.cat([y * s2 if s2 != 1.0 else y, torch.full_like(half_y, s2), half_y], dim=-1)
    return exp_nonpositive_(torch.bmm(x_aug, y_aug.transpose(-1, -2)))


def _position_grads(
    weighted: Tensor,
    x: Tensor,
    y: Tensor,
    row: Tensor,
    col: Tensor,
    s2: float,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, Tensor | None]:
    """Gradients of x and y from ``weighted = ∂L/∂κ ∘ κ`` and its row and column sums:
    ``∂L/∂x_i = s² Σ_j weighted_ij (y_j − x_i)``, ``∂L/∂y_j = s² Σ_i weighted_ij (x_i − y_j)``.
    (Also where the clamp bit: at 0, x_i = y_j up to rounding and both sides are 0; at the
    floor, the entry is the smallest normal number.)"""
    grad_x = torch.baddbmm(x * (row * -s2), weighted, y, alpha=s2) if needs[0] else None
    grad_y = torch.baddbmm(y * (col * -s2), weighted.mT, x, alpha=s2) if needs[1] else None
    return grad_x, grad_y


class _GaussianKernel(torch.autograd.Function):
    """``κ(x, y)`` for 3-D ``x (N, Lx, D)``, ``y (N, Ly, D)``."""

    @staticmethod
    def forward(x: Tensor, y: Tensor, s2: float) -> Tensor:
        with autocast_off(x):
            return _kernel(x, y, s2)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, y, ctx.s2 = inputs
        ctx.save_for_backward(x, y, output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, y, kernel = ctx.saved_tensors
        with autocast_off(x):
            weighted = grad.to(kernel.dtype) * kernel
            row, col = weighted.sum(dim=-1, keepdim=True), weighted.sum(dim=-2)[..., None]
            grads = _position_grads(weighted, x, y, row, col, ctx.s2, ctx.needs_input_grad)
        return *grads, None


def gaussian_product(
    x: Tensor, y: Tensor, w: Tensor, *, transpose: bool = False, scale: float = 1.0
) -> Tensor:
    """``κ(s·x, s·y) @ w`` (or ``κ(s·x, s·y)ᵀ @ w`` with ``transpose``; s = ``scale``) with a
    hand-written backward.

    ``x (..., Lx, D)``, ``y (..., Ly, D)``; ``w (..., Ly, Dv)`` (``(..., Lx, Dv)`` transposed);
    batch dims broadcast. The backward pass needs no sum over the ``(Lx, Ly)`` kernel: its row
    and column sums of ``∂L/∂κ ∘ κ`` come from the output and the gradient of w (e.g.
    ``Σ_j (g wᵀ)_ij κ_ij = Σ_c g_ic out_ic``), so it takes one elementwise pass and four
    products. Runs outside autocast, in the dtype of the inputs. Once differentiable; the
    output is saved for backward, so modifying it in place before backward raises (as for
    ``torch.exp``).
    """
    batch, (x, y, w) = _flatten("x (..., Lx, D), y (..., Ly, D), w", x, y, w)
    rows = x.shape[-2] if transpose else y.shape[-2]
    if w.shape[-2] != rows:
        raise ValueError(f"w must be (..., {rows}, Dv), got {tuple(w.shape)}")
    out, _ = _GaussianProduct.apply(x, y, w, transpose, float(scale) ** 2)
    return out.reshape(*batch, *out.shape[-2:])


class _GaussianProduct(torch.autograd.Function):
    @staticmethod
    def forward(
        x: Tensor, y: Tensor, w: Tensor, transpose: bool, s2: float
    ) -> tuple[Tensor, Tensor]:
        with autocast_off(x):
            kernel = _kernel(x, y, s2)
            return torch.bmm(kernel.transpose(-1, -2) if transpose else kernel, w), kernel

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        x, y, w, ctx.transpose, ctx.s2 = inputs
        out, kernel = output
        ctx.mark_non_differentiable(kernel)
        ctx.set_materialize_grads(False)  # no zero gradient of the kernel output
        ctx.save_for_backward(x, y, w, out, kernel)
        ctx.kernel_used = False

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor | None, _: Tensor | None) -> tuple[Tensor | None, ...]:
        x, y, w, out, kernel = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None
        need_x, need_y, need_w = ctx.needs_input_grad[:3]
        with autocast_off(x):
            if ctx.kernel_used:  # a second backward (retain_graph): the first one wrote over it
                kernel = _kernel(x, y, ctx.s2)
            grad = grad.to(out.dtype)
            if ctx.transpose:  # out = κᵀ w (Ly, Dv), w (Lx, Dv): ∂L/∂κ = w gᵀ
                grad_w = torch.bmm(kernel, grad)
                left, right = w, grad
            else:  # out = κ w (Lx, Dv), w (Ly, Dv): ∂L/∂κ = g wᵀ
                grad_w = torch.bmm(kernel.transpose(-1, -2), grad)
                left, right = grad, w
            if not (need_x or need_y):
                return None, None, grad_w, None, None
            if ctx.transpose:
                row = (w * grad_w).sum(dim=-1, keepdim=True)
                col = (grad * out).sum(dim=-1, keepdim=True)
            else:
                row = (grad * out).sum(dim=-1, keepdim=True)
                col = (w * grad_w).sum(dim=-1, keepdim=True)
            # ∂L/∂κ ∘ κ over the kernel's own storage: `.data`, so the saved tensor's version
            # does not move (a second backward rebuilds the kernel instead, see above)
            weighted = _weigh_in_place(kernel.data, left, right.transpose(-1, -2))
            ctx.kernel_used = True
            grad_x, grad_y = _position_grads(weighted, x, y, row, col, ctx.s2, ctx.needs_input_grad)
        return grad_x, grad_y, grad_w if need_w else None, None, None


def _weigh_in_place(kernel: Tensor, left: Tensor, right_t: Tensor) -> Tensor:
    """``kernel ∘ (left @ right_t)`` written over ``kernel``. On the CPU by blocks of rows of
    about :data:`WEIGHT_BLOCK_ENTRIES` (each product block still in cache when it is
    multiplied in; no second buffer of the kernel's size), at most :data:`WEIGHT_MAX_BLOCKS`."""
    n, rows, cols = kernel.shape
    step = rows
    if kernel.device.type == "cpu":
        step = max(-(-rows // WEIGHT_MAX_BLOCKS), WEIGHT_BLOCK_ENTRIES // max(1, n * cols), 1)
    for start in range(0, rows, step):
        block = slice(start, start + step)
        kernel[:, block].mul_(torch.bmm(left[:, block], right_t))
    return kernel


@without_autocast
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
    k, v = zero_padded(key_padding_mask, k.to(acc), v.to(acc))
    kernel = gaussian_kernel(q.to(acc), k, scale=q.shape[-1] ** -0.25)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    if dropout_p > 0:
        kernel = torch.nn.functional.dropout(kernel, p=dropout_p)
    return (kernel @ v).to(out_dtype)


def gaussian_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_padding_mask: Tensor | None = None
) -> Tensor:
    """The definition, with explicit pairwise distances (slow; for tests)."""
    acc, out_dtype = accumulation_dtype(v.dtype), v.dtype
    k, v = zero_padded(key_padding_mask, k.to(acc), v.to(acc))
    scale = q.shape[-1] ** -0.25
    dist2 = torch.cdist(q.to(acc) * scale, k * scale).square()
    kernel = torch.exp(-0.5 * dist2)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    return (kernel @ v).to(out_dtype)
