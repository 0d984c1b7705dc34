"""Causal linear attention one token at a time: the recurrent step, O(M·Dv) per token.

Continues a :class:`~kattn.functional.linear_causal.LinearState` from
:func:`~kattn.functional.linear_causal.linear_attention_prefill` or from earlier steps; the
outputs of successive steps equal the chunkwise-parallel causal forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .linear_causal import LinearState, checked_state
from .numerics import DEFAULT_EPS, exp_nonpositive, guard_normaliser, prepare_linear_inputs


def linear_attention_step(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState,
    *,
    k_log_scale: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """One causal step, O(M·Dv) time and memory whatever the position.

    Args:
        phi_q, phi_k: ``(B, H, 1, M)``; v: ``(B, H, 1, Dv)``; k_log_scale: ``(B, H, 1)``.
        state: the state after the previous tokens.

    Returns:
        The output ``(B, H, 1, Dv)`` and the state including this token.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, None)
    num, den, state = causal_step_sums(fq, fk, v32, s, state)
    return (num / guard_normaliser(den, eps)).to(v.dtype), state


def causal_step_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    state: LinearState,
    *,
    log_decay: Tensor | None = None,
) -> tuple[Tensor, Tensor, LinearState]:
    """The unnormalised sums of one step (see :func:`causal_linear_sums`), in the units of
    the new state's offset: ``num (B, H, 1, Dv)``, ``den (B, H, 1, 1)``, the new state."""
    kv, k_sum, offset = checked_state(state, fk, v.shape[-1])
    fk, v = fk[:, :, 0], v[:, :, 0]  # (B, H, M), (B, H, Dv)
    s_t = fk.new_zeros(fk.shape[:-1]) if s is None else s[:, :, 0]  # (B, H); no scale: 0
    # the state's offset, decayed by one step, against the new key (a decayed running max)
    prev = offset if log_decay is None else offset + log_decay.to(fk.dtype).expand(offset.shape)
    new_offset = torch.maximum(prev, s_t.detach())
    decay = exp_nonpositive(prev - new_offset)[..., None]  # (B, H, 1)
    fk = fk * exp_nonpositive(s_t - new_offset)[..., None]
    if torch.is_grad_enabled() and (kv.requires_grad or fk.requires_grad or v.requires_grad):
        kv, k_sum = kv * decay[..., None], k_sum * decay
        kv, k_sum = kv + fk[..., :, None] * v[..., None, :], k_sum + fk
    else:
        kv, k_sum = _decayed_update(kv, k_sum, decay, fk, v)
    return fq @ kv, fq @ k_sum[..., None], LinearState(kv, k_sum, new_offset)


def _decayed_update(
    kv: Tensor, k_sum: Tensor, decay: Tensor, fk: Tensor, v: Tensor
) -> tuple[Tensor, Tensor]:
    """``(decay · kv + fk vᵀ, decay · k_sum + fk)`` without a graph, in as few passes over the
    ``(B, H, M, Dv)`` state as possible: decoding is bound by them. The sums are updated in
    place, as the key/value cache of softmax is, so a step consumes its input state (to branch,
    clone it first); sums that cannot be written (leaves that require a gradient, inference
    tensors outside inference mode, strided views) are copied instead. When no factor differs
    from 1 (the running offset did not move, checked on the CPU where it costs nothing) the
    rescaling pass is skipped."""
    b, h, m, dv = kv.shape
    outer = (fk.reshape(b * h, m, 1), v.reshape(b * h, 1, dv))
    unit = kv.device.type == "cpu" and bool((decay == 1).all())
    if not (_writable(kv) and _writable(k_sum)):
        kv, k_sum = kv.clone(), k_sum.clone()
    flat = kv.view(b * h, m, dv)
    if not unit:
        flat.mul_(decay.reshape(b * h, 1, 1))
        k_sum.mul_(decay)
    flat.baddbmm_(*outer)
    return flat.view(b, h, m, dv), k_sum.add_(fk)


def _writable(x: Tensor) -> bool:
    """``x`` may be updated in place: contiguous (so no element is stored twice), no leaf of a
    graph, no inference tensor outside inference mode."""
    return (
        x.is_contiguous()
        and not x.requires_grad
        and (torch.is_inference_mode_enabled() or not x.is_inference())
    )
