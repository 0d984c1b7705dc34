"""What the relative-position kernels share: a forward by a kernel whose gradients are those of
the PyTorch path (recomputed in backward), the device check, and input preparation that keeps
half-precision tensors in their dtype for the kernel."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...functional.numerics import accumulation_dtype, log_floor

__all__ = [
    "block_size",
    "check_block",
    "check_kernel_inputs",
    "dot_precision",
    "interpreted",
    "kernel_with_reference_grad",
    "masked_inputs",
]

#: a log-offset below every real one but far from overflow when shifted (``−∞`` would give
#: ``−∞ − (−∞) = NaN`` where a row sees no key at all)
NO_OFFSET = -1e30
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_kernel_inputs(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> None:
    """Raise ``ValueError`` for CPU tensors outside Triton's interpreter, for float64 ones
    (the kernels accumulate in fp32: the PyTorch path serves float64) and unless ``phi_q``
    is ``(B, H, Lq, M)``, ``phi_k`` ``(B, H, Lk, M)`` and ``v`` ``(B, H, Lk, Dv)``."""
    xs = (phi_q, phi_k, v)
    if xs[0].device.type == "cpu" and not interpreted():
        raise ValueError(
            "the Triton kernels run on CUDA tensors, or on CPU tensors with TRITON_INTERPRET=1 "
            "set before kattn.ops.triton is imported; use the PyTorch path on the CPU"
        )
    dtypes = sorted({str(x.dtype) for x in xs if x.dtype not in _KERNEL_DTYPES})
    if dtypes:
        raise ValueError(
            f"the Triton kernels take float16, bfloat16 or float32 inputs, got {dtypes}; "
            "use the PyTorch path for float64"
        )
    b, h, _, m = phi_q.shape
    if phi_k.shape[:2] != (b, h) or phi_k.shape[-1] != m or phi_k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"phi_q must be (B, H, Lq, M), phi_k (B, H, Lk, M) and v (B, H, Lk, Dv), got "
            f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}"
        )


def check_block(name: str, size: int) -> None:
    """Raise ``ValueError`` unless ``size`` is a power of two of at least 16."""
    if size < 16 or size & (size - 1):
        raise ValueError(f"{name} must be a power of two of at least 16, got {size}")


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision for outputs of ``dtype``: IEEE fp32 products for fp32 outputs,
    TF32 (exact on fp16/bf16 inputs, rounding fp32 sums to 10 bits) for half precision."""
    return "ieee" if dtype == torch.float32 else "tf32"


def block_size(n: int) -> int:
    """The smallest power of two >= ``n`` and >= 16 (``tl.dot`` needs 16 on every side)."""
    return max(16, 1 << max(0, (n - 1).bit_length()))


def masked_inputs(
    phi_k: Tensor, v: Tensor, k_log_scale: Tensor | None, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Padded keys and values zeroed (not even a NaN there reaches an output) in their own
    dtype, and the log-scales in the accumulation dtype with padded keys at the floor."""
    s = None if k_log_scale is None else k_log_scale.to(accumulation_dtype(v.dtype))
    if key_padding_mask is None:
        return phi_k, v, s
    pad = key_padding_mask[:, None, :]
    phi_k, v = phi_k.masked_fill(pad[..., None], 0.0), v.masked_fill(pad[..., None], 0.0)
    if s is not None:
        s = s.masked_fill(pad, log_floor(s.dtype))
    return phi_k, v, s


class _KernelForward(torch.autograd.Function):
    """``kernel(*tensors, **options)`` forward; backward differentiates
    ``reference(*tensors, **options)`` recomputed from the saved inputs (exact gradients,
    the PyTorch path's memory and time)."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Callable[..., Tensor],
        reference: Callable[..., Tensor],
        options: dict[str, Any],
        *tensors: Tensor | None,
    ) -> Tensor:
        ctx.reference, ctx.options = reference, options
        ctx.save_for_backward(*tensors)
        return kernel(*tensors, **options)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        wanted = ctx.needs_input_grad[3:]
        with torch.enable_grad():
            inputs = [
                None if x is None else x.detach().requires_grad_(need)
                for x, need in zip(saved, wanted, strict=True)
            ]
            out = ctx.reference(*inputs, **ctx.options)
            leaves = [x for x in inputs if x is not None and x.requires_grad]
            found = iter(torch.autograd.grad(out, leaves, grad, allow_unused=True))
        grads = [next(found) if x is not None and x.requires_grad else None for x in inputs]
        return (None, None, None, *grads)


def kernel_with_reference_grad(
    kernel: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    tensors: tuple[Tensor | None, ...],
    **options: Any,
) -> Tensor:
    """``kernel(*tensors, **options)``, differentiable as ``reference`` (same arguments)."""
    out: Tensor = _KernelForward.apply(kernel, reference, options, *tensors)
    return out
