"""Kernelized attention with a relative positional encoding, by FFT (Luo et al. 2021).

``z_i = Σ_j c_{j−i} φ(q_i)·φ(k_j) v_j / Σ_j c_{j−i} φ(q_i)·φ(k_j)`` with ``c = exp(b)``.
The matrix ``C = [c_{j−i}]`` is Toeplitz, so with ``A1_j = φ(k_j) ⊗ v_j`` and ``A2_j = φ(k_j)``
the sums ``D1 = C·A1`` and ``D2 = C·A2`` cost O(L log L) per channel by FFT (Algorithm 1 of
the paper), and ``z_i = φ(q_i)·D1_i / φ(q_i)·D2_i``.

Coefficients are given as log-coefficients ``b`` over the offsets ``j − i`` from ``−(Lq−1)`` to
``Lk−1`` (index ``j − i + Lq − 1``). Paths:

* :func:`rpe_linear_attention_fft` — the FFT algorithm (non-causal, causal, padding,
  cross-attention), in fp32 (fp64 stays fp64), with the ``M·(Dv+1)`` channels processed in
  blocks of bounded size.
* :func:`~kattn.functional.linear.linear_attention_reference` with ``coeff`` — the dense
  ``C ⊙ (φ(Q)φ(K)ᵀ)`` form, O(Lq·Lk).

The FFT mixes every position with every other in floating point, so each output carries an
absolute round-off of about ``1e-7 × the largest coefficient × feature`` in fp32, whatever its
own size. In causal mode that would let future keys leak into early positions, whose sums are
small, at a relative level near 1e-4; so causal products run in fp64 by default (2.3× the
fp32 time on the 2-core CPU at L=16384, M=32: 920 vs 401 ms) and non-causal ones in fp32
(``fft_dtype`` chooses). Beyond round-off, the sums share one set of units (the largest
coefficient and key log-scale), so:

* the normaliser guard is measured in each query's own units (its largest visible coefficient
  plus the largest key log-scale it sees), never in units a query does not see;
* causal queries whose own units lie more than a quarter of the dtype's digits below the
  shared ones (9 nats in fp64) — a prefix, behind a heavier key or coefficient still to come —
  are recomputed on that prefix alone, where the heavier keys are absent (exactly in blocks
  where that is cheaper), so no future key sets their precision.

The banded and decay paths (:mod:`kattn.functional.banded`, :mod:`kattn.functional.decay`)
are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.utils.checkpoint
from torch import Tensor

from .numerics import (
    DEFAULT_EPS,
    guard_in_units,
    guard_normaliser,
    prepare_linear_inputs,
    scaled_key_features,
)
from .rpe_blocked import (
    RowLogCoefficients,
    ToeplitzRows,
    prefer_blocked,
    rpe_linear_attention_blocked,
)
from .rpe_units import imprecise_prefix, query_log_units, with_prefix

#: default bound on the real elements of one block of FFT channels (2^24: 64 MiB in fp32).
DEFAULT_MAX_BLOCK_ELEMENTS = 1 << 24


def fft_length(n: int) -> int:
    """The smallest ``2^a·3^b·5^c >= n``: lengths that FFT libraries transform fastest."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            size = p35
            while size < n:
                size *= 2
            best = min(best, size)
            p35 *= 3
        p5 *= 5
    return best


def circulant_embedding(coeff: Tensor, lq: int, lk: int, n: int, dim: int = -1) -> Tensor:
    """Place the coefficients of offsets ``−(lq−1)…lk−1`` along ``dim`` into a length-``n``
    circulant kernel ``u`` with ``u[(i − j) mod n] = c_{j−i}`` (``n >= lq + lk − 1``)."""
    dim = dim % coeff.dim()
    if coeff.shape[dim] != lq + lk - 1:
        raise ValueError(
            f"coefficients must cover Lq + Lk − 1 = {lq + lk - 1} offsets along dim {dim}, "
            f"got {coeff.shape[dim]}"
        )
    past = coeff.narrow(dim, 0, lq).flip(dim)  # offsets 0, −1, ..., −(lq−1) at u[0..lq−1]
    future = coeff.narrow(dim, lq, lk - 1).flip(dim)  # offsets lk−1, ..., 1 at u[n−lk+1..n−1]
    gap = list(coeff.shape)
    gap[dim] = n - (lq + lk - 1)
    return torch.cat([past, coeff.new_zeros(gap), future], dim=dim)


def toeplitz_matmul(coeff: Tensor, x: Tensor, lq: int) -> Tensor:
    """``y_i = Σ_j c_{j−i} x_j`` over the last dim by FFT.

    Args:
        coeff: ``(..., Lq + Lk − 1)`` coefficients of offsets ``−(Lq−1)…Lk−1``, broadcastable
            against ``x`` in the leading dims.
        x: ``(..., Lk)``, the sequence last.
        lq: the output length.

    Returns:
        ``(..., Lq)``.
    """
    lk = x.shape[-1]
    n = fft_length(lq + lk - 1)
    spectrum = torch.fft.rfft(circulant_embedding(coeff, lq, lk, n), n=n)
    return torch.fft.irfft(spectrum * torch.fft.rfft(x, n=n), n=n)[..., :lq]


def toeplitz_dense(coeff: Tensor, lq: int, lk: int) -> Tensor:
    """The ``(..., Lq, Lk)`` matrix ``[c_{j−i}]`` of coefficients ``(..., Lq + Lk − 1)``."""
    i = torch.arange(lq, device=coeff.device)[:, None]
    j = torch.arange(lk, device=coeff.device)[None, :]
    return coeff[..., j - i + lq - 1]


def shifted_coefficients(log_coeff: Tensor, lq: int, causal: bool) -> Tensor:
    """``exp(b − max b)`` over the offsets in use (the shift cancels in the ratio), with the
    future offsets ``j − i > 0`` zeroed in causal mode."""
    if not causal:
        return torch.exp(log_coeff - log_coeff.detach().amax(dim=-1, keepdim=True))
    past = log_coeff.narrow(-1, 0, lq)  # offsets −(lq−1)…0; the rest is the future
    coeff = torch.exp(past - past.detach().amax(dim=-1, keepdim=True))
    return torch.cat([coeff, coeff.new_zeros(*coeff.shape[:-1], log_coeff.shape[-1] - lq)], -1)


def clamp_to_value_range(out: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """Clamp ``out (B, H, Lq, Dv)`` to the range of the non-padded values ``v (B, H, Lk, Dv)``
    (0 where every key is padding)."""
    big = torch.finfo(v.dtype).max
    if key_padding_mask is None:
        low, high = v.amin(dim=2, keepdim=True), v.amax(dim=2, keepdim=True)
    else:
        pad = key_padding_mask[:, None, :, None]
        low = v.masked_fill(pad, big).amin(dim=2, keepdim=True)
        high = v.masked_fill(pad, -big).amax(dim=2, keepdim=True)
        empty = low > high
        low, high = low.masked_fill(empty, 0.0), high.masked_fill(empty, 0.0)
    return torch.minimum(torch.maximum(out, low.to(out.dtype)), high.to(out.dtype))


def spectral_product(x: Tensor, spectrum: Tensor) -> Tensor:
    """``x · spectrum``, in place when no gradient is recorded (x is a fresh temporary)."""
    return x * spectrum if torch.is_grad_enabled() else x.mul_(spectrum)


def in_fft_dtype(
    fq: Tensor, fk: Tensor, v: Tensor, s: Tensor | None, causal: bool, dtype: torch.dtype | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Cast the prepared inputs to the precision of the FFT products (see the module doc)."""
    if dtype is None:
        dtype = torch.float64 if causal else fq.dtype
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"fft_dtype must be torch.float32 or torch.float64, got {dtype}")
    return fq.to(dtype), fk.to(dtype), v.to(dtype), None if s is None else s.to(dtype)


def weighted_kernel_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    apply: Callable[[Tensor, slice], Tensor],
    *,
    transform_size: int,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """``num_i = fq_i·(T·(fk ⊗ v))_i`` and ``den_i = fq_i·(T·fk)_i`` for a linear operator ``T``
    along the sequence, applied to channel blocks of bounded size.

    Args:
        fq: ``(N, Lq, M)``; fk: ``(N, Lk, M)`` (scaled, padding zeroed); v: ``(N, Lk, Dv)``.
        apply: ``apply(x, rows)`` maps ``x (r, m, Dv+1, Lk)`` of the rows ``rows`` to
            ``(r, m, Dv+1, Lq)``.
        transform_size: real elements of the transform of one channel (to size blocks).
        max_block_elements: bound on the elements of one block of channels.

    Returns:
        ``num (N, Lq, Dv)`` and ``den (N, Lq, 1)``.
    """
    n_rows, lk, m = fk.shape
    dv = v.shape[-1]
    v_ext = torch.cat([v, v.new_ones(n_rows, lk, 1)], dim=-1)  # the last channel gives D2
    per_feature = (dv + 1) * transform_size  # real elements of one feature's transform
    m_block = max(1, min(m, max_block_elements // max(1, per_feature)))
    r_block = max(1, min(n_rows, max_block_elements // max(1, per_feature * m_block)))
    checkpointed = torch.is_grad_enabled() and (r_block < n_rows or m_block < m)

    def block(fq_b: Tensor, fk_b: Tensor, v_b: Tensor, rows: slice) -> Tensor:
        x = fk_b.transpose(1, 2)[:, :, None, :] * v_b.transpose(1, 2)[:, None, :, :]
        y = apply(x, rows)  # (r, m, Dv+1, Lq)
        # Σ_m fq[r, i, m] y[r, m, e, i]: a broadcast product and a sum (an einsum here
        # would copy y query by query)
        return (y * fq_b.transpose(1, 2)[:, :, None, :]).sum(dim=1).transpose(1, 2)

    row_sums = []
    for r0 in range(0, n_rows, r_block):
        rows = slice(r0, r0 + r_block)
        total: Tensor | None = None
        for f0 in range(0, m, m_block):
            feats = slice(f0, f0 + m_block)
            args = (fq[rows, :, feats], fk[rows, :, feats], v_ext[rows], rows)
            if checkpointed:
                # recompute each block in backward instead of keeping every block's spectra
                part = torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
            else:
                part = block(*args)
            total = part if total is None else total + part
        assert total is not None
        row_sums.append(total)
    sums = row_sums[0] if len(row_sums) == 1 else torch.cat(row_sums, dim=0)
    return sums[..., :dv], sums[..., dv:]


def rpe_linear_attention_fft(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_coeff: Tensor,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
    fft_dtype: torch.dtype | None = None,
    convex: bool = False,
) -> Tensor:
    """Kernelized attention with Toeplitz RPE by FFT (Luo et al. Algorithm 1).

    Args:
        phi_q: ``(B, H, Lq, M)`` query features (a positive per-query factor cancels).
        phi_k: ``(B, H, Lk, M)`` key features, scaled by ``exp(k_log_scale)`` if given.
        v: ``(B, H, Lk, Dv)``.
        log_coeff: ``(H, Lq + Lk − 1)`` log-coefficients ``b`` of offsets ``−(Lq−1)…Lk−1``.
        causal: query i sees keys j <= i (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that must not count.
        eps: guard of the normaliser.
        max_block_elements: bound on the elements of one block of FFT channels.
        fft_dtype: precision of the products; default fp64 when causal, else the accumulation
            dtype (fp32; fp64 for fp64 inputs).
        convex: every weight is >= 0 (positive features), so each output is a convex
            combination of values: clamp outputs to the values' range, which round-off can
            leave when a row's weights are all far below the largest ones.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    fq, fk, v32, s = in_fft_dtype(fq, fk, v32, s, causal, fft_dtype)
    lq, lk = fq.shape[2], fk.shape[2]
    if causal and lq != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
    if log_coeff.shape[-1] != lq + lk - 1:
        raise ValueError(
            f"coefficients must cover Lq + Lk − 1 = {lq + lk - 1} offsets, "
            f"got {log_coeff.shape[-1]}"
        )
    options = _Options(eps, convex, max_block_elements)
    log_coeff = log_coeff.to(fq.dtype)
    if causal:
        out = _causal_attention(fq, fk, v32, s, log_coeff, key_padding_mask, options)
    else:
        units = query_log_units(log_coeff, s, lq, lk, causal=False)
        out = _fft_attention(fq, fk, v32, s, log_coeff, False, key_padding_mask, units, options)
    return out.to(v.dtype)


class _Options(NamedTuple):
    eps: float
    convex: bool
    max_block_elements: int


def _fft_attention(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    causal: bool,
    key_padding_mask: Tensor | None,
    units: Tensor,
    options: _Options,
) -> Tensor:
    """Algorithm 1 on prepared inputs: one FFT of the shifted coefficients, the sums in units
    shared by all queries, the guard in each query's (``units``, see :func:`query_log_units`)."""
    b, h, lq, _ = fq.shape
    lk = fk.shape[2]
    coeff = shifted_coefficients(log_coeff, lq, causal)  # (H, Lq+Lk−1)
    n = fft_length(lq + lk - 1)
    spectrum = torch.fft.rfft(circulant_embedding(coeff, lq, lk, n), n=n)  # (H, F)
    spectrum = spectrum.expand(b, h, -1).reshape(b * h, 1, 1, -1)

    def apply(x: Tensor, rows: slice) -> Tensor:
        return torch.fft.irfft(spectral_product(torch.fft.rfft(x, n=n), spectrum[rows]), n=n)[
            ..., :lq
        ]

    return transformed_attention(
        fq, fk, v, s, apply, n, eps=guard_in_units(options.eps, units), convex=options.convex,
        key_padding_mask=key_padding_mask, max_block_elements=options.max_block_elements,
    )  # fmt: skip


#: FFTs of ever shorter prefixes at most, before the rest is recomputed exactly in blocks:
#: coefficients that grow with distance would otherwise shrink each prefix by a few queries
_FFT_PREFIXES = 3


def _causal_attention(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    log_coeff: Tensor,
    key_padding_mask: Tensor | None,
    options: _Options,
    prefixes: int = 0,
) -> Tensor:
    """Causal Algorithm 1 where no future key sets a query's precision: the FFT's sums are in
    units of the largest key log-scale and past coefficient of the whole sequence, so the
    queries whose own units (:func:`query_log_units`) lie more than a quarter of the dtype's
    digits below them — a prefix, as both maxima only grow — are recomputed on that prefix
    alone (by FFT again, or exactly in blocks where that is cheaper or after
    :data:`_FFT_PREFIXES` FFTs), where the heavier keys are absent."""
    length = fq.shape[2]
    units = query_log_units(log_coeff, s, length, length, causal=True)
    out = _fft_attention(fq, fk, v, s, log_coeff, True, key_padding_mask, units, options)
    below, p = imprecise_prefix(units, fq.dtype)
    if p == 0:
        return out
    keep = (fq[:, :, :p], fk[:, :, :p], v[:, :, :p], None if s is None else s[:, :, :p])
    coeff = log_coeff[:, length - p : length + p - 1]  # offsets −(p−1)…p−1
    mask = None if key_padding_mask is None else key_padding_mask[:, :p]
    b, h, _, m = fq.shape
    points = fft_length(2 * p - 1)
    blocked = prefer_blocked(b * h, p, p, m, v.shape[-1], points, causal=True, device=fq.device)
    if blocked or prefixes >= _FFT_PREFIXES:
        head = exact_causal(*keep, ToeplitzRows(coeff, p), mask, options.eps, options.convex)
    else:
        head = _causal_attention(*keep, coeff, mask, options, prefixes + 1)
    return with_prefix(out, below, head)


def exact_causal(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    rows: RowLogCoefficients,
    key_padding_mask: Tensor | None,
    eps: float,
    convex: bool,
) -> Tensor:
    """Causal attention of prepared inputs, exact in blocks of queries (each in its own
    units), clamped to the values' range when ``convex``."""
    out = rpe_linear_attention_blocked(fq, fk, v, rows, causal=True, k_log_scale=s, eps=eps)
    return clamp_to_value_range(out, v, key_padding_mask) if convex else out


def transformed_attention(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    apply: Callable[[Tensor, slice], Tensor],
    transform_size: int,
    *,
    eps: float | Tensor,
    convex: bool,
    key_padding_mask: Tensor | None,
    max_block_elements: int,
) -> Tensor:
    """The ratio ``φ(q)·T(φ(k) ⊗ v) / φ(q)·T(φ(k))`` for prepared inputs ``(B, H, L, ·)`` and
    a sequence operator ``apply`` (see :func:`weighted_kernel_sums`); keys are scaled by
    their log-scales ``s`` (one shift per row), outputs optionally clamped to the values'
    range (``convex``); ``eps`` guards the normaliser (a number, or one per query ``(B or 1, H,
    Lq, 1)``). Returns ``(B, H, Lq, Dv)`` in the inputs' dtype."""
    b, h, lq, m = fq.shape
    lk = fk.shape[2]
    num, den = weighted_kernel_sums(
        fq.reshape(b * h, lq, m),
        scaled_key_features(fk, s).reshape(b * h, lk, m),
        v.reshape(b * h, lk, -1),
        apply,
        transform_size=transform_size,
        max_block_elements=max_block_elements,
    )
    if isinstance(eps, Tensor):
        eps = eps.expand(b, h, lq, 1).reshape(b * h, lq, 1)
    out = (num / guard_normaliser(den, eps)).reshape(b, h, lq, -1)
    return clamp_to_value_range(out, v, key_padding_mask) if convex else out
