"""Numerical helpers shared by the attention maths: dtypes, guards, safe exponentials, and the
padding of sequences that recurrences over positions share (PyTorch paths and kernels)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

_F = TypeVar("_F", bound=Callable[..., Any])

#: default guard of normalisers of signed features: ``|den|`` is never smaller than this.
DEFAULT_EPS = 1e-6
#: guard of normalisers of positive features: it only keeps a zero normaliser (every feature
#: zero or underflowed, e.g. a fully padded row) from dividing by zero, and leaves room for
#: gradients (about 1/den) to stay finite.
POSITIVE_EPS = 1e-30


def autocast_off(x: Tensor) -> Any:
    """A context with autocast disabled on ``x``'s device: the products inside run in the dtype
    of their inputs. On a device type autocast does not know (``meta``), where nothing is
    autocast anyway, no context (``torch.autocast`` would raise "unsupported scalarType")."""
    if not torch.amp.is_autocast_available(x.device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=x.device.type, enabled=False)


def without_autocast(fn: _F) -> _F:
    """Run ``fn`` with autocast disabled on the device of its first argument (a tensor): for
    computations that choose their own accumulation dtype."""

    @functools.wraps(fn)
    def wrapper(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        with autocast_off(x):
            return fn(x, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half precision and fp32 inputs, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def log_floor(dtype: torch.dtype) -> float:
    """A finite stand-in for −∞ in log-scales (so that floor − floor = 0, never NaN)."""
    return torch.finfo(dtype).min


def exp_floor(dtype: torch.dtype) -> float:
    """Exponents below this give subnormal results in ``dtype`` (about −86 for fp32)."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


def exp_nonpositive(x: Tensor) -> Tensor:
    """``exp(x)`` for ``x <= 0`` (larger x count as 0), with exponents floored at
    :func:`exp_floor`: results below the smallest normal number are not representable
    accurately anyway, and CPU ``exp`` is tens of times slower on arguments that underflow."""
    return torch.exp(x.clamp(exp_floor(x.dtype), 0.0))


def exp_nonpositive_(x: Tensor) -> Tensor:
    """In-place :func:`exp_nonpositive`, for a fresh temporary that no backward needs."""
    return x.clamp_(exp_floor(x.dtype), 0.0).exp_()


#: how far (nats) below the units of shared sums the normaliser guard follows a query's own
#: units; beyond, fp32 sums would be subnormal anyway
GUARD_UNITS_FLOOR = 60.0


def guard_in_units(eps: float, log_units: Tensor) -> Tensor:
    """The guard ``eps`` measured in each query's own units: ``eps · exp(u)`` ``(..., L, 1)``
    for ``log_units`` ``u (..., L)``, each query's units less those of the sums (<= 0,
    followed down to :data:`GUARD_UNITS_FLOOR`)."""
    return eps * torch.exp(log_units.clamp(-GUARD_UNITS_FLOOR, 0.0))[..., None]


def guard_normaliser(den: Tensor, eps: float | Tensor) -> Tensor:
    """Keep ``|den| >= eps`` with its sign, so the ratio never divides by zero (``eps`` a
    number, or a tensor broadcasting against ``den``: one per row)."""
    return torch.where(den >= 0, den.clamp_min(eps), den.clamp_max(-eps))


def prepare_linear_inputs(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    k_log_scale: Tensor | None,
    key_padding_mask: Tensor | None,
    *,
    log_scales: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Upcast to the accumulation dtype; zero padded keys and values (so that not even a NaN
    there can reach an output) and put their log-scale at the floor. ``log_scales``: keys
    without log-scales get them (0), for paths whose parts carry units of their own (a part
    without keys, or with padding alone, then sits at the floor and sets no units)."""
    acc = accumulation_dtype(v.dtype)
    fq, fk, v = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    s = None if k_log_scale is None else k_log_scale.to(acc)
    if s is None and log_scales:
        s = fk.new_zeros(fk.shape[:3])
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]  # (B, 1, Lk)
        fk = fk.masked_fill(pad[..., None], 0.0)
        v = v.masked_fill(pad[..., None], 0.0)
        if s is not None:
            s = s.masked_fill(pad, log_floor(acc))
    return fq, fk, v, s


def key_scales(s: Tensor) -> Tensor:
    """``exp(s − max s)`` over the last dim: one shift for all keys of a row (it cancels in
    the ratio, so it carries no gradient); keys at the log-scale floor (padding) get 0."""
    return exp_nonpositive(s - s.detach().amax(dim=-1, keepdim=True))


def scaled_key_features(fk: Tensor, s: Tensor | None) -> Tensor:
    """``fk · exp(s − max s)`` (see :func:`key_scales`); ``fk`` itself when ``s`` is None."""
    return fk if s is None else fk * key_scales(s)[..., None]


def zero_padded(key_padding_mask: Tensor | None, *xs: Tensor) -> tuple[Tensor, ...]:
    """Each of ``xs`` ``(B, H, Lk, ·)`` with the padded positions of ``key_padding_mask``
    ``(B, Lk)`` set to 0 (unchanged without a mask): a NaN or Inf stored there then reaches no
    output or gradient, where masking weights alone would let it through 0 × NaN."""
    if key_padding_mask is None:
        return xs
    pad = key_padding_mask[:, None, :, None]
    return tuple(x.masked_fill(pad, 0.0) for x in xs)


def delayed(x: Tensor, delay: int, value: float = 0.0) -> Tensor:
    """``x`` ``(B, H, T, ·)`` or ``(B, H, T)`` moved ``delay`` positions later along T, the
    first ``delay`` positions ``value``; the same shape (the last ``delay`` positions drop)."""
    length = x.shape[2]
    if x.dim() == 3:
        return F.pad(x, (delay, 0), value=value)[:, :, :length]
    return F.pad(x, (0, 0, delay, 0), value=value)[:, :, :length]


def one_length(
    fq: Tensor, fk: Tensor, v: Tensor, s: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Queries ``(B, H, Lq, M)`` and keys, values and log-scales ``(B, H, Lk, ·)`` padded at the
    end to one length ``max(Lq, Lk)`` (zero features, log-scales at the floor), for
    recurrences that walk positions with queries and keys together (added key positions count
    nothing, whatever their log-scale: their features are zero)."""
    lq, lk = fq.shape[2], fk.shape[2]
    length = max(lq, lk)
    fq = F.pad(fq, (0, 0, 0, length - lq))
    fk, v = (F.pad(x, (0, 0, 0, length - lk)) for x in (fk, v))
    if s is not None:
        s = F.pad(s, (0, length - lk), value=log_floor(s.dtype))
    return fq, fk, v, s
