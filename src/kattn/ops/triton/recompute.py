"""A forward by a kernel whose gradients are those of the PyTorch path, recomputed in backward,
or, when the kernel has a backward of its own, those kernels' (the PyTorch path then only
under ``create_graph=True``, and for the decay scan and the banded kernels beyond the sizes
their backward fits): how the relative-position kernels are differentiable, and how the
linear kernels take a backward with ``create_graph=True``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...functional.linear import linear_attention

__all__ = ["kernel_with_reference_grad", "linear_reference_grads", "reference_grads"]


def reference_grads(
    reference: Callable[..., Tensor],
    tensors: dict[str, Tensor | None],
    wanted: tuple[bool, ...],
    grad: Tensor,
    options: dict[str, Any],
) -> list[Tensor | None]:
    """Gradients (None where not ``wanted``) of ``reference(**tensors, **options)`` against
    ``grad``, recomputed from the saved inputs. Inside ``backward(create_graph=True)`` (grad
    mode on) they are taken on the inputs themselves with a graph, so that a second
    derivative, such as a gradient penalty, reaches them; otherwise on detached copies."""
    higher = torch.is_grad_enabled()
    with torch.enable_grad():
        inputs = [
            None if x is None else x if higher else x.detach().requires_grad_(need)
            for x, need in zip(tensors.values(), wanted, strict=True)
        ]
        out = reference(**dict(zip(tensors, inputs, strict=True)), **options)
        leaves = [x for x, need in zip(inputs, wanted, strict=True) if x is not None and need]
        found = iter(torch.autograd.grad(out, leaves, grad, allow_unused=True, create_graph=higher))
    return [
        next(found) if x is not None and need else None
        for x, need in zip(inputs, wanted, strict=True)
    ]


def linear_reference_grads(
    tensors: tuple[Tensor, Tensor, Tensor, Tensor | None],
    wanted: tuple[bool, ...],
    grad: Tensor,
    *,
    causal: bool,
    eps: float,
) -> list[Tensor | None]:
    """:func:`reference_grads` of :func:`~kattn.functional.linear_attention` for the saved
    ``(phi_q, phi_k, v, k_log_scale)`` of a linear kernel: its backward with
    ``create_graph=True``, differentiable again through the PyTorch path's graph."""
    names = dict(zip(("phi_q", "phi_k", "v", "k_log_scale"), tensors, strict=True))
    options = dict(causal=causal, eps=eps)
    return reference_grads(linear_attention, names, wanted, grad, options)


class _KernelForward(torch.autograd.Function):
    """``kernel(**tensors, **options, **kernel_options)`` forward; backward differentiates
    ``reference(**tensors, **options)`` recomputed from the saved inputs (exact gradients,
    the PyTorch path's memory and time), or, when given and the backward builds no graph,
    ``differentiable(**tensors, **options, **kernel_options)``: the kernel's result again,
    differentiated by kernels of its own."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Callable[..., Tensor],
        reference: Callable[..., Tensor],
        differentiable: Callable[..., Tensor] | None,
        names: tuple[str, ...],
        options: dict[str, Any],
        kernel_options: dict[str, Any],
        *tensors: Tensor | None,
    ) -> Tensor:
        ctx.reference, ctx.differentiable = reference, differentiable
        ctx.names, ctx.options, ctx.kernel_options = names, options, kernel_options
        ctx.save_for_backward(*tensors)
        return kernel(**dict(zip(names, tensors, strict=True)), **options, **kernel_options)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        saved = dict(zip(ctx.names, ctx.saved_tensors, strict=True))
        wanted = tuple(ctx.needs_input_grad[6:])
        if ctx.differentiable is not None and not torch.is_grad_enabled():
            options = {**ctx.options, **ctx.kernel_options}
            grads = reference_grads(ctx.differentiable, saved, wanted, grad, options)
        else:  # a graph of the gradients (create_graph=True): the PyTorch path's
            grads = reference_grads(ctx.reference, saved, wanted, grad, ctx.options)
        return (None, None, None, None, None, None, *grads)


def kernel_with_reference_grad(
    kernel: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    tensors: dict[str, Tensor | None],
    *,
    options: dict[str, Any],
    kernel_options: dict[str, Any],
    differentiable: Callable[..., Tensor] | None = None,
) -> Tensor:
    """``kernel(**tensors, **options, **kernel_options)``, differentiable as
    ``reference(**tensors, **options)`` (the PyTorch path; ``kernel_options`` such as a chunk
    size are the kernel's alone). ``differentiable``: the same result by kernels that have a
    backward of their own, which a backward without ``create_graph`` differentiates instead
    (recomputing the forward once, not the PyTorch path)."""
    names = tuple(tensors)
    out: Tensor = _KernelForward.apply(
        kernel, reference, differentiable, names, options, kernel_options, *tensors.values()
    )
    return out
