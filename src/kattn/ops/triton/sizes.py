"""The sizes the Triton kernels are checked to fit, asked without importing triton: the most
features and value columns whose launches fit the shared memory of an sm_80 GPU (compiled
ahead of time by ``tests/ops/test_triton_shared_memory.py``)."""

from __future__ import annotations

import torch

__all__ = [
    "MAX_FP64_FEATURES",
    "MAX_FP64_VALUES",
    "MAX_KERNEL_FEATURES",
    "MAX_KERNEL_VALUES",
    "checked_sizes",
]

#: the most features and value columns whose kernels are known to fit the shared memory of an
#: sm_80 GPU with fp32 or half inputs (compiled ahead of time by
#: tests/ops/test_triton_shared_memory.py).
MAX_KERNEL_FEATURES, MAX_KERNEL_VALUES = 256, 128
#: the same with fp64 inputs (``backend="triton"`` only; ``"auto"`` keeps fp64 on PyTorch),
#: whose tiles take twice the bytes: states up to 64 × 64 scan chunks of 64 tokens, which in
#: fp64 fit only up to these sizes.
MAX_FP64_FEATURES, MAX_FP64_VALUES = 32, 64


def checked_sizes(dtype: torch.dtype) -> tuple[int, int]:
    """The most features and value columns checked to fit, for values of ``dtype``."""
    if dtype == torch.float64:
        return MAX_FP64_FEATURES, MAX_FP64_VALUES
    return MAX_KERNEL_FEATURES, MAX_KERNEL_VALUES
