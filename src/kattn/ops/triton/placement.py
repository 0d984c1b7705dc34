"""Where the Triton kernels may run, asked without importing triton: whether triton imports,
whether Triton runs kernels in its interpreter, and which tensors a kernel can read."""

from __future__ import annotations

import functools
import os

from torch import Tensor

__all__ = ["check_device", "interpreted", "kernels_read", "triton_importable"]


@functools.cache
def triton_importable() -> bool:
    """Whether ``import triton`` succeeds (asked once per process)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernels_read(x: Tensor) -> bool:
    """Whether a kernel can read ``x``: a CUDA tensor, or a CPU tensor in the interpreter."""
    return x.device.type == "cuda" or (x.device.type == "cpu" and interpreted())


def check_device(x: Tensor) -> None:
    """``ValueError`` for tensors a kernel cannot read (:func:`kernels_read`)."""
    if not kernels_read(x):
        raise ValueError(
            f"the Triton kernels run on CUDA tensors, or on CPU tensors with TRITON_INTERPRET=1 "
            f"set before triton is imported; got {x.device.type} tensors: use backend='torch' "
            "there"
        )
