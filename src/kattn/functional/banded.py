"""Kernelized attention with relative positional weights that are constant far away: exact, in
linear time.

When ``c_{j−i}`` takes one value ``c_L`` for all offsets ``j − i <= −left`` and one value ``c_R``
for all ``j − i >= right`` (T5 buckets beyond their last boundary, for instance), the Toeplitz
matrix is a band plus two constants. So

* the band is computed exactly, query chunk by query chunk against a window of keys;
* the far field is ``c_L·Σ_{far left} φ(k_j) v_jᵀ + c_R·Σ_{far right} φ(k_j) v_jᵀ``: prefix and
  suffix sums of per-chunk sums (non-causal), or ``c_L`` times causal linear attention plus
  the band's correction ``c_{j−i} − c_L`` (causal);

in O(L·((left + right)·(M + Dv) + M·Dv)) time instead of the FFT's O(L log L·M·Dv), with the
same result. :func:`banded_step` decodes with a window of the last ``left`` tokens and one
linear-attention state for the rest.

Coefficients are given as log-coefficients ``(H, left + right + 1)`` of the offsets
``−left…right``; the first and the last hold for every offset beyond.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    LinearState,
    causal_linear_sums,
    causal_step_sums,
    linear_attention_init_state,
)
from .numerics import (
    DEFAULT_EPS,
    exp_nonpositive,
    guard_normaliser,
    log_floor,
    prepare_linear_inputs,
    scaled_key_features,
)


def banded_log_coefficients(log_coeff: Tensor, left: int, lq: int, lk: int) -> Tensor:
    """The log-coefficients of every offset ``−(lq−1)…lk−1``: ``(H, lq + lk − 1)``."""
    right = log_coeff.shape[-1] - 1 - left
    offsets = torch.arange(-(lq - 1), lk, device=log_coeff.device).clamp(-left, right)
    return log_coeff[:, offsets + left]


def _band_matrix(coeff: Tensor, left: int, chunk: int, span: int, first: int) -> Tensor:
    """``(H, C, span)``: entry ``(p, x)`` is the coefficient of offset ``x − first − p``
    (query p of a chunk, key x of its window, the window starting ``first`` keys before
    the chunk), clamped to the constant ends."""
    right = coeff.shape[-1] - 1 - left
    p = torch.arange(chunk, device=coeff.device)[:, None]
    x = torch.arange(span, device=coeff.device)[None, :]
    return coeff[:, (x - first - p).clamp(-left, right) + left]


def _windows(
    x: Tensor, before: int, chunk: int, span: int, n_chunks: int, value: float = 0.0
) -> Tensor:
    """``(N, L, ·)`` or ``(N, L)`` → windows ``(N, n, span, ·)``: window t holds positions
    ``t·C − before … t·C − before + span − 1`` (outside the sequence: ``value``)."""
    total = (n_chunks - 1) * chunk + span
    pad = (before, total - before - x.shape[1])
    if x.dim() == 3:
        x = F.pad(x, (0, 0, *pad), value=value).unfold(1, span, chunk)  # (N, n, ·, span)
        return x.transpose(-1, -2)
    return F.pad(x, pad, value=value).unfold(1, span, chunk)


def banded_linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    left: int,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Kernelized attention with positional weights constant beyond a band, exact.

    Args:
        phi_q: ``(B, H, Lq, M)``; phi_k: ``(B, H, Lk, M)`` scaled by ``exp(k_log_scale)``;
            v: ``(B, H, Lk, Dv)``.
        log_coeff: ``(H, left + right + 1)`` log-coefficients of offsets ``−left…right``; the
            ends hold for all offsets beyond.
        left: ``>= 1``, see ``log_coeff``.
        causal, key_padding_mask, chunk_size, block_size, eps: as for linear attention
            (``chunk_size`` also sets the query chunks of the band).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    right = log_coeff.shape[-1] - 1 - left
    if left < 1 or right < 1:
        raise ValueError(f"the band needs left >= 1 and right >= 1, got {left} and {right}")
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    b, h, lq, _ = fq.shape
    lk, dv = fk.shape[2], v32.shape[-1]
    if causal and lq != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
    log_coeff = log_coeff.to(fq.dtype)
    c = max(1, min(chunk_size, lq))
    n = -(-lq // c)
    if causal:
        num, den = _causal_banded(fq, fk, v32, s, log_coeff, left, c, n, block_size)
    else:
        num, den = _bidirectional_banded(fq, fk, v32, s, log_coeff, left, c, n)
    out = num.reshape(b, h, -1, dv)[:, :, :lq] / guard_normaliser(
        den.reshape(b, h, -1, 1)[:, :, :lq], eps
    )
    return out.to(v.dtype)


def _bidirectional_banded(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    left: int,
    c: int,
    n: int,
) -> tuple[Tensor, Tensor]:
    b, h, lq, m = fq.shape
    lk, dv = fk.shape[2], v.shape[-1]
    right = log_coeff.shape[-1] - 1 - left
    coeff = torch.exp(log_coeff - log_coeff.detach().amax(dim=-1, keepdim=True))  # (H, K)
    fk = scaled_key_features(fk, s).reshape(b * h, lk, m)
    v_ext = torch.cat([v, v.new_ones(b, h, lk, 1)], dim=-1).reshape(b * h, lk, dv + 1)
    fq = F.pad(fq.reshape(b * h, lq, m), (0, 0, 0, n * c - lq)).view(b * h, n, c, m)
    # window of chunk t: keys t·C − (left−1) ... , a whole number k of key chunks
    before = left - 1
    k = -(-(c + left + right - 2) // c)
    span = k * c
    # far field: key chunks entirely left (right) of the window, by prefix (suffix) sums
    n_keys = max(n + k - 1, -(-(lk + before) // c))
    fk_chunks = F.pad(fk, (0, 0, before, n_keys * c - lk - before)).view(b * h, n_keys, c, m)
    v_chunks = F.pad(v_ext, (0, 0, before, n_keys * c - lk - before)).view(b * h, n_keys, c, -1)
    chunk_sums = torch.einsum("ntcm,ntce->ntme", fk_chunks, v_chunks)  # (N, n_keys, M, Dv+1)
    prefix = F.pad(chunk_sums.cumsum(dim=1), (0, 0, 0, 0, 1, 0))[:, :n]  # chunks < t
    suffix = F.pad(chunk_sums.flip(1).cumsum(dim=1).flip(1), (0, 0, 0, 0, 0, 1))  # chunks >= u
    c_left, c_right = coeff[:, 0], coeff[:, -1]  # (H,)
    far = prefix.view(b, h, n, m, dv + 1) * c_left[:, None, None, None]
    far = far + suffix[:, k : k + n].view(b, h, n, m, dv + 1) * c_right[:, None, None, None]
    sums = fq @ far.view(b * h, n, m, dv + 1)  # (N, n, C, Dv+1)
    # the band: every key of the window with its exact coefficient
    fk_win = _windows(fk, before, c, span, n)  # (N, n, span, M)
    v_win = _windows(v_ext, before, c, span, n)  # (N, n, span, Dv+1)
    band = _band_matrix(coeff, left, c, span, before)  # (H, C, span)
    scores = (fq @ fk_win.transpose(-1, -2)).view(b, h, n, c, span) * band[None, :, None]
    sums = sums + scores.view(b * h, n, c, span) @ v_win
    return sums[..., :dv], sums[..., dv:]


def _causal_banded(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    left: int,
    c: int,
    n: int,
    block_size: int,
) -> tuple[Tensor, Tensor]:
    b, h, lq, m = fq.shape
    dv = v.shape[-1]
    past = log_coeff[:, : left + 1]  # offsets −left…0
    coeff = torch.exp(past - past.detach().amax(dim=-1, keepdim=True))  # (H, left+1)
    # c_L everywhere (causal linear attention with running-max offsets r_i) ...
    num, den, r, _ = causal_linear_sums(fq, fk, v, s, chunk_size=c, block_size=block_size)
    c_left = coeff[:, 0][None, :, None, None]
    num, den = (x * c_left for x in (num, den))
    # ... plus (c_{j−i} − c_L) on the band −(left−1) <= j − i <= 0, in the same offsets r_i
    before = left - 1
    span = c + before
    n_flat = b * h
    band = F.pad(coeff - coeff[:, :1], (0, 1))  # offsets −left…1; offset 1 (future) → 0
    band = _band_matrix(band, left, c, span, before)  # (H, C, span)
    fq_c = F.pad(fq.reshape(n_flat, lq, m), (0, 0, 0, n * c - lq)).view(n_flat, n, c, m)
    v_ext = torch.cat([v, v.new_ones(b, h, lq, 1)], dim=-1).reshape(n_flat, lq, dv + 1)
    fk_win = _windows(fk.reshape(n_flat, lq, m), before, c, span, n)  # (N, n, span, M)
    v_win = _windows(v_ext, before, c, span, n)  # (N, n, span, Dv+1)
    scores = fq_c @ fk_win.transpose(-1, -2)  # (N, n, C, span)
    if s is not None and r is not None:
        s_win = _windows(s.reshape(n_flat, lq), before, c, span, n, log_floor(s.dtype))
        r_c = F.pad(r.reshape(n_flat, lq), (0, n * c - lq)).view(n_flat, n, c)
        scores = scores * exp_nonpositive(s_win[:, :, None, :] - r_c[..., None])
    scores = scores.view(b, h, n, c, span) * band[None, :, None]
    sums = (scores.view(n_flat, n, c, span) @ v_win).view(b, h, n * c, dv + 1)[:, :, :lq]
    return num + sums[..., :dv], den + sums[..., dv:]


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
    past = log_coeff[:, : left + 1].to(fq.dtype)  # offsets −left…0, shifted (it cancels)
    past = past - past.detach().amax(dim=-1, keepdim=True)
    # one offset for the window and the far sums: the largest log-scale of either
    top = torch.maximum(far.offset, log_scales.detach().amax(dim=-1))  # (B, H)
    weights = (fq @ keys.transpose(-1, -2))[:, :, 0]  # (B, H, w)
    weights = weights * torch.exp(past[:, left + 1 - w :] + log_scales - top[..., None])
    num = (weights[:, :, None, :] @ values)[:, :, 0]  # (B, H, Dv)
    den = weights.sum(dim=-1, keepdim=True)
    to_top = exp_nonpositive(far.offset - top)[..., None] * past[:, 0].exp()[:, None]
    num = num + to_top * (fq @ far.kv)[:, :, 0]
    den = den + to_top * (fq @ far.k_sum[..., None])[:, :, 0]
    out = (num / guard_normaliser(den, eps))[:, :, None].to(v.dtype)
    return out, BandedState(far, keys, values, log_scales)
