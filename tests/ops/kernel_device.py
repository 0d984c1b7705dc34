"""Where the kernel tests run: CPU tensors in Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` without CUDA, before triton is imported), else CUDA tensors."""

from __future__ import annotations

import pytest
import torch

from kattn.ops.triton.placement import interpreted

#: CPU tensors in the interpreter, CUDA tensors on a GPU; references are computed on the CPU.
DEVICE = "cpu" if interpreted() else "cuda"

#: the mark of a module whose tests need the kernels to run somewhere.
needs_kernels = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()), reason="neither CUDA nor the interpreter"
)
