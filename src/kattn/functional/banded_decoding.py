"""Decoding of banded relative-position attention: a window of recent tokens and one state.

With coefficients constant beyond ``left`` past offsets (see :mod:`kattn.functional.banded`),
token t sees the last ``left`` tokens with their own coefficients and every older token with
``c_L``: a window of ``left`` keys and values plus one linear-attention state, so a step
costs O(left·(M + Dv) + M·Dv) whatever the position.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .linear_causal import LinearState, linear_attention_init_state
from .linear_step import causal_step_sums
from .numerics import DEFAULT_EPS, exp_nonpositive, guard_normaliser, prepare_linear_inputs


class BandedState(NamedTuple):
    """Decoding state of banded attention: the last ``left`` tokens and the rest summed.

    Attributes:
        far: linear-attention state of the tokens beyond the window.
        keys: ``(B, H, w, M)``, values ``(B, H, w, Dv)``, log_scales ``(B, H, w)``: the window
            (oldest first, ``w <= left``).
    """

    far: LinearState
    keys: Tensor
    values: Tensor
    log_scales: Tensor


def banded_init_state(
    batch_size: int,
    num_heads: int,
    num_features: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> BandedState:
    """The state before any token."""
    far = linear_attention_init_state(
        batch_size, num_heads, num_features, 0, device=device, dtype=dtype
    )
    acc = far.kv.dtype
    return BandedState(
        far,
        torch.zeros(batch_size, num_heads, 0, num_features, device=device, dtype=acc),
        torch.zeros(batch_size, num_heads, 0, 0, device=device, dtype=acc),
        torch.zeros(batch_size, num_heads, 0, device=device, dtype=acc),
    )


def banded_step(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: BandedState,
    log_coeff: Tensor,
    left: int,
    *,
    k_log_scale: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, BandedState]:
    """One causal token in O(left·(M + Dv) + M·Dv), whatever its position.

    Args:
        phi_q, phi_k: ``(B, H, 1, M)``; v: ``(B, H, 1, Dv)``; k_log_scale: ``(B, H, 1)``.
        state: from :func:`banded_init_state` or the previous step.
        log_coeff, left: as for :func:`banded_linear_attention` (offsets ``−left…0`` used).
    """
    if not isinstance(state, BandedState):
        raise ValueError(
            f"state must be a BandedState (from init_state), got {type(state).__name__}"
        )
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, None)
    if s is None:
        s = fk.new_zeros(fk.shape[:-1])
    far, keys, values, log_scales = state
    if values.shape[-1] == 0:
        values = values.new_zeros(*values.shape[:-1], v32.shape[-1])
    kv = far.kv.to(fq.dtype)
    if kv.shape[-1] == 0:
        kv = kv.new_zeros(*kv.shape[:-1], v32.shape[-1])
    far = LinearState(kv, far.k_sum.to(fq.dtype), far.offset.to(fq.dtype))
    if keys.shape[2] == left:  # the oldest token leaves the window for the far sums
        _, _, far = causal_step_sums(
            fq, keys[:, :, :1], values[:, :, :1], log_scales[:, :, :1], far
        )
        keys, values, log_scales = keys[:, :, 1:], values[:, :, 1:], log_scales[:, :, 1:]
    keys = torch.cat([keys.to(fq.dtype), fk], dim=2)
    values = torch.cat([values.to(fq.dtype), v32], dim=2)
    log_scales = torch.cat([log_scales.to(fq.dtype), s], dim=2)
    w = keys.shape[2]
    past = log_coeff[:, : left + 1].to(fq.dtype)  # offsets −left…0
    # each key's log-weight c_{j−t} + s_j: the window's, and the far sums' at their offset
    near = past[:, left + 1 - w :] + log_scales  # (B, H, w)
    far_log = past[:, 0] + far.offset  # (B, H)
    # the sums in this token's own units (its largest weight), where the guard is measured,
    # as in the causal path
    top = torch.maximum(far_log, near.amax(dim=-1)).detach()
    weights = (fq @ keys.transpose(-1, -2))[:, :, 0] * torch.exp(near - top[..., None])
    num = (weights[:, :, None, :] @ values)[:, :, 0]  # (B, H, Dv)
    den = weights.sum(dim=-1, keepdim=True)
    to_top = exp_nonpositive(far_log - top)[..., None]
    num = num + to_top * (fq @ far.kv)[:, :, 0]
    den = den + to_top * (fq @ far.k_sum[..., None])[:, :, 0]
    out = (num / guard_normaliser(den, eps))[:, :, None].to(v.dtype)
    return out, BandedState(far, keys, values, log_scales)
