"""Inputs of the linear-attention Triton kernel tests (causal, non-causal, decoding step):
CPU tensors in Triton's interpreter, CUDA tensors on a GPU."""

from __future__ import annotations

import torch
from torch import Tensor

from .kernel_device import DEVICE


def linear_inputs(
    b: int,
    h: int,
    lq: int,
    lk: int,
    m: int,
    dv: int,
    *,
    dtype: torch.dtype = torch.float32,
    log_scales: bool = False,
    signed: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Features ``(B, H, Lq, M)`` and ``(B, H, Lk, M)``, values ``(B, H, Lk, Dv)`` and key
    log-scales ``(B, H, Lk)`` (None unless ``log_scales``), drawn in float64 from seed 0 and
    cast to ``dtype`` on :data:`DEVICE`.

    The features are positive (as PRF's) unless ``signed``: then shifted by -0.4, as
    trigonometric features, whose normaliser may be small. The log-scales spread over several
    units (standard deviation 4).
    """
    g = torch.Generator().manual_seed(0)
    fq = torch.rand(b, h, lq, m, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(b, h, lk, m, generator=g, dtype=torch.float64) + 0.05
    if signed:
        fq, fk = fq - 0.4, fk - 0.4
    v = torch.randn(b, h, lk, dv, generator=g, dtype=torch.float64)
    s = 4.0 * torch.randn(b, h, lk, generator=g, dtype=torch.float64) if log_scales else None
    fq, fk, v = (x.to(DEVICE, dtype) for x in (fq, fk, v))
    return fq, fk, v, None if s is None else s.to(DEVICE, dtype)
