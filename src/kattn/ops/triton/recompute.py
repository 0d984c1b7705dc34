"""A forward by a kernel whose gradients are those of the PyTorch path, recomputed in backward:
how the relative-position kernels (decay, banded, blocked Toeplitz) are differentiable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["kernel_with_reference_grad"]


class _KernelForward(torch.autograd.Function):
    """``kernel(**tensors, **options, **kernel_options)`` forward; backward differentiates
    ``reference(**tensors, **options)`` recomputed from the saved inputs (exact gradients,
    the PyTorch path's memory and time)."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Callable[..., Tensor],
        reference: Callable[..., Tensor],
        names: tuple[str, ...],
        options: dict[str, Any],
        kernel_options: dict[str, Any],
        *tensors: Tensor | None,
    ) -> Tensor:
        ctx.reference, ctx.names, ctx.options = reference, names, options
        ctx.save_for_backward(*tensors)
        return kernel(**dict(zip(names, tensors, strict=True)), **options, **kernel_options)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        wanted = ctx.needs_input_grad[5:]
        with torch.enable_grad():
            inputs = [
                None if x is None else x.detach().requires_grad_(need)
                for x, need in zip(saved, wanted, strict=True)
            ]
            out = ctx.reference(**dict(zip(ctx.names, inputs, strict=True)), **ctx.options)
            leaves = [x for x in inputs if x is not None and x.requires_grad]
            found = iter(torch.autograd.grad(out, leaves, grad, allow_unused=True))
        grads = [next(found) if x is not None and x.requires_grad else None for x in inputs]
        return (None, None, None, None, None, *grads)


def kernel_with_reference_grad(
    kernel: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    tensors: dict[str, Tensor | None],
    *,
    options: dict[str, Any],
    kernel_options: dict[str, Any],
) -> Tensor:
    """``kernel(**tensors, **options, **kernel_options)``, differentiable as
    ``reference(**tensors, **options)`` (the PyTorch path; ``kernel_options`` such as a chunk
    size are the kernel's alone)."""
    names = tuple(tensors)
    out: Tensor = _KernelForward.apply(
        kernel, reference, names, options, kernel_options, *tensors.values()
    )
    return out
