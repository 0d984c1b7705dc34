"""Numerical helpers shared by the attention maths: dtypes, guards, safe exponentials."""

from __future__ import annotations

import torch
from torch import Tensor

#: exponents are clamped here before ``exp`` where the result only needs to be negligible:
#: ``exp(−80) ≈ 2e-35`` cannot move an fp32 sum, and CPU ``exp`` is tens of times slower on
#: arguments whose result underflows.
EXP_FLOOR = -80.0
#: default guard of normalisers: ``|den|`` is never smaller than this.
DEFAULT_EPS = 1e-6


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half precision and fp32 inputs, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def log_floor(dtype: torch.dtype) -> float:
    """A finite stand-in for −∞ in log-scales (so that floor − floor = 0, never NaN)."""
    return torch.finfo(dtype).min


def exp_nonpositive(x: Tensor) -> Tensor:
    """``exp(x)`` for ``x <= 0`` (larger x count as 0), exponents floored at :data:`EXP_FLOOR`."""
    return torch.exp(x.clamp(EXP_FLOOR, 0.0))


def exp_nonpositive_(x: Tensor) -> Tensor:
    """In-place :func:`exp_nonpositive`, for a fresh temporary that no backward needs."""
    return x.clamp_(EXP_FLOOR, 0.0).exp_()


def guard_normaliser(den: Tensor, eps: float | Tensor) -> Tensor:
    """Keep ``|den| >= eps`` with its sign, so the ratio never divides by zero."""
    return torch.where(den >= 0, den.clamp_min(eps), den.clamp_max(-eps))


def prepare_linear_inputs(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    k_log_scale: Tensor | None,
    key_padding_mask: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Upcast to the accumulation dtype; zero padded keys and put their log-scale at the floor."""
    acc = accumulation_dtype(v.dtype)
    fq, fk, v = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    s = None if k_log_scale is None else k_log_scale.to(acc)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]  # (B, 1, Lk)
        fk = fk.masked_fill(pad[..., None], 0.0)
        if s is not None:
            s = s.masked_fill(pad, log_floor(acc))
    return fq, fk, v, s
