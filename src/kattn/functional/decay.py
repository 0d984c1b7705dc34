"""Kernelized attention with decaying relative positional weights, exact and in linear time.

``c_{j−i} = Σ_r α_r γ_r^{|j−i|}`` (one set of ``α_r >= 0``, ``0 < γ_r < 1`` for the past
``j <= i`` and one for the future ``j > i``). Each term is a decaying recurrence
``S_i = γ S_{i−1} + φ(k_i) v_iᵀ``, so

* causal attention is R decaying causal linear attentions, computed chunkwise in parallel
  (:func:`~kattn.functional.linear_causal.causal_linear_sums` with ``log_decay``), and one
  token costs O(R·M·Dv) whatever its position (:func:`decay_step`);
* non-causal attention adds the future terms: the same on the reversed sequence, shifted by
  one position (``j > i`` strictly).

Every path equals :func:`~kattn.functional.linear.linear_attention_reference` with the dense
coefficients :func:`decay_log_coefficients`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    LinearState,
    causal_linear_sums,
    linear_attention_init_state,
)
from .linear_step import causal_step_sums
from .numerics import DEFAULT_EPS, delayed, guard_normaliser, log_floor, one_length
from .numerics import prepare_linear_inputs as _prepare


def decay_log_coefficients(log_alpha: Tensor, log_gamma: Tensor, lq: int, lk: int) -> Tensor:
    """``log c`` over the offsets ``−(lq−1)…lk−1``: ``(H, lq + lk − 1)``.

    Args:
        log_alpha, log_gamma: ``(H, 2, R)``; side 0 holds the past terms (offsets <= 0),
            side 1 the future terms (offsets > 0).
    """
    offsets = torch.arange(-(lq - 1), lk, device=log_alpha.device, dtype=log_alpha.dtype)
    side = (offsets > 0).long()  # (K,)
    terms = log_alpha[:, side] + offsets.abs()[None, :, None] * log_gamma[:, side]  # (H, K, R)
    return torch.logsumexp(terms, dim=-1)


def repeat_terms(x: Tensor, r: int) -> Tensor:
    """``(B, H, ...) → (B, H·R, ...)``, each head repeated for its R terms."""
    b, h = x.shape[:2]
    return x.unsqueeze(2).expand(b, h, r, *x.shape[2:]).reshape(b, h * r, *x.shape[2:])


def decay_linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_alpha: Tensor,
    log_gamma: Tensor,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Kernelized attention weighted by ``c_{j−i} = Σ_r α_r γ_r^{|j−i|}``, in O(L·R·M·Dv).

    Args:
        phi_q: ``(B, H, Lq, M)``; phi_k: ``(B, H, Lk, M)`` scaled by ``exp(k_log_scale)``;
            v: ``(B, H, Lk, Dv)``.
        log_alpha: ``(H, 2, R)`` log-weights; log_gamma: ``(H, 2, R)`` log-decays (< 0).
            Side 0: the past (j <= i); side 1: the future (j > i, unused when causal).
        causal, key_padding_mask, chunk_size, block_size, eps: as for linear attention.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    # a side without keys (the last query's future, the fill of the shorter length, padding)
    # must not set the units in which the normaliser is guarded: keys get log-scales, so that
    # such a side's offset sits at the floor
    needs_scales = not causal or key_padding_mask is not None
    fq, fk, v32, s = _prepare(
        phi_q, phi_k, v, k_log_scale, key_padding_mask, log_scales=needs_scales
    )
    b, h, lq, _ = fq.shape
    lk = fk.shape[2]
    r = log_alpha.shape[-1]
    log_alpha, log_gamma = log_alpha.to(fq.dtype), log_gamma.to(fq.dtype)
    if causal and lq != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
    fq, fk, v32, s = one_length(fq, fk, v32, s)  # the recurrences run over positions
    length = fq.shape[2]
    sides = [(fq, fk, v32)]
    scales = [s]
    if not causal:
        # future terms: the reversed sequence, keys shifted by one so that j > i strictly
        back = [delayed(x.flip(2), 1) for x in (fk, v32)]
        sides.append((fq.flip(2), back[0], back[1]))
        if s is not None:
            scales.append(delayed(s.flip(2), 1, log_floor(s.dtype)))
    n_sides = len(sides)
    q_all, k_all, v_all = (
        torch.cat([repeat_terms(side[i], r) for side in sides], dim=1) for i in range(3)
    )
    s_all = None
    if s is not None:
        s_all = torch.cat([repeat_terms(x, r) for x in scales if x is not None], dim=1)
    decays = log_gamma[:, :n_sides].transpose(0, 1).reshape(1, -1)  # (1, sides·H·R)
    num, den, offsets, _ = causal_linear_sums(
        q_all,
        k_all,
        v_all,
        s_all,
        log_decay=decays,
        chunk_size=chunk_size,
        block_size=block_size,
    )
    if offsets is None:  # no log-scales: every term's sums are in the same units
        offsets = num.new_zeros(num.shape[:-1])
    split = [x.view(b, n_sides, h, r, length, -1) for x in (num, den, offsets[..., None])]
    if n_sides == 2:  # back to the original order
        split = [torch.cat([x[:, :1], x[:, 1:].flip(4)], dim=1) for x in split]
    num, den, offsets = split
    # the future side's query i reads keys from i+1: one more decay step (γ) in its weight
    log_weight = log_alpha[:, :n_sides] + F.pad(log_gamma[:, 1:n_sides], (0, 0, 1, 0))
    log_w = offsets + log_weight.transpose(0, 1)[None, ..., None, None]
    # the shift cancels in num/den, but not where the normaliser guard holds: not detached
    w = torch.exp(log_w - log_w.amax(dim=(1, 3), keepdim=True))
    num, den = ((x * w).sum(dim=(1, 3))[:, :, :lq] for x in (num, den))
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def decay_init_state(
    batch_size: int,
    num_heads: int,
    num_terms: int,
    num_features: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> LinearState:
    """The state before any token: one causal linear state per head and term."""
    return linear_attention_init_state(
        batch_size, num_heads * num_terms, num_features, 0, device=device, dtype=dtype
    )


def decay_prefill(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState,
    log_alpha: Tensor,
    log_gamma: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """L causal tokens after ``state`` in chunkwise-parallel form (a prompt before
    :func:`decay_step`): the output ``(B, H, L, Dv)`` and the state after the L tokens.

    Args as :func:`decay_step`, with L tokens; ``state`` from :func:`decay_init_state` or
    earlier steps.
    """
    fq, fk, v32, s = _prepare(phi_q, phi_k, v, k_log_scale, None)
    rows, log_decay = _past_terms(fq, fk, v32, s, state, log_alpha, log_gamma)
    num, den, offsets, state = causal_linear_sums(
        *rows, state, log_decay=log_decay, chunk_size=chunk_size, block_size=block_size
    )
    assert offsets is not None  # a given state always gives the keys log-scales
    return _combine_past_terms(num, den, offsets, log_alpha, eps).to(v.dtype), state


def decay_step(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState,
    log_alpha: Tensor,
    log_gamma: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """One causal token, O(R·M·Dv) whatever the position: ``S_r ← γ_r S_r + φ(k) vᵀ``.

    Args:
        phi_q, phi_k: ``(B, H, 1, M)``; v: ``(B, H, 1, Dv)``; k_log_scale: ``(B, H, 1)``.
        state: from :func:`decay_init_state` or the previous step.
        log_alpha, log_gamma: ``(H, 2, R)``; only the past side (0) is used.
    """
    fq, fk, v32, s = _prepare(phi_q, phi_k, v, k_log_scale, None)
    rows, log_decay = _past_terms(fq, fk, v32, s, state, log_alpha, log_gamma)
    num, den, state = causal_step_sums(*rows, state, log_decay=log_decay)
    offsets = state.offset[..., None]  # the sums are in units of the new (decayed) offsets
    return _combine_past_terms(num, den, offsets, log_alpha, eps).to(v.dtype), state


def _past_terms(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    state: LinearState,
    log_alpha: Tensor,
    log_gamma: Tensor,
) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor | None], Tensor]:
    """The inputs of the past side's R recurrences per head (prefill and step): ``fq, fk, v,
    s`` repeated to ``(B, H·R, ...)`` and their log-decays ``(1, H·R)``; ``ValueError`` unless
    ``log_alpha`` and ``log_gamma`` have one shape and ``state`` (from
    :func:`decay_init_state`) holds H·R rows."""
    if log_alpha.shape != log_gamma.shape:
        raise ValueError(
            "log_alpha and log_gamma must have one (H, 2, R) shape, got "
            f"{tuple(log_alpha.shape)} and {tuple(log_gamma.shape)}"
        )
    h, r = fq.shape[1], log_gamma.shape[-1]
    if state.kv.shape[1] != h * r:
        raise ValueError(
            f"state holds {state.kv.shape[1]} rows, expected heads × terms = {h} × {r}"
        )
    rows = (
        repeat_terms(fq, r),
        repeat_terms(fk, r),
        repeat_terms(v, r),
        None if s is None else repeat_terms(s, r),
    )
    return rows, log_gamma[:, 0].to(fq.dtype).reshape(1, h * r)


def _combine_past_terms(
    num: Tensor, den: Tensor, offsets: Tensor, log_alpha: Tensor, eps: float
) -> Tensor:
    """``Σ_r α_r num_r / Σ_r α_r den_r`` ``(B, H, L, Dv)`` from the past terms' sums ``num (B,
    H·R, L, Dv)`` and ``den (B, H·R, L, 1)``, each in units of its own offset ``(B, H·R, L)``:
    weighted in log space, shifted by the largest weight (which cancels in the ratio, though
    not where the normaliser guard holds: it is not detached)."""
    b, rows, length = offsets.shape
    r = log_alpha.shape[-1]
    h = rows // r
    log_w = log_alpha[:, 0].to(num.dtype)[None, :, :, None] + offsets.view(b, h, r, length)
    w = torch.exp(log_w - log_w.amax(dim=2, keepdim=True))[..., None]
    num, den = ((x.view(b, h, r, length, -1) * w).sum(dim=2) for x in (num, den))
    return num / guard_normaliser(den, eps)
