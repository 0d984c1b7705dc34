"""Kernelized attention with relative positional weights that are constant far away: exact, in
linear time.

When ``c_{j−i}`` takes one value ``c_L`` for all offsets ``j − i <= −left`` and one value ``c_R``
for all ``j − i >= right`` (T5 buckets beyond their last boundary, for instance), the Toeplitz
matrix is a band plus two constants. So

* the band is computed exactly, query chunk by query chunk against a window of keys;
* the far field is ``c_L·Σ_{far left} φ(k_j) v_jᵀ + c_R·Σ_{far right} φ(k_j) v_jᵀ``: prefix and
  suffix sums of per-chunk sums (non-causal), or ``c_L`` times causal linear attention over
  the keys delayed by ``left`` positions (causal);

in O(L·((left + right)·(M + Dv) + M·Dv)) time instead of the FFT's O(L log L·M·Dv), with the
same result. :func:`~kattn.functional.banded_step` decodes with a window of the
last ``left`` tokens and one linear-attention state for the rest.

Coefficients are given as log-coefficients ``(H, left + right + 1)`` of the offsets
``−left…right``; the first and the last hold for every offset beyond.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    causal_linear_sums,
)
from .numerics import (
    DEFAULT_EPS,
    delayed,
    exp_nonpositive,
    guard_in_units,
    guard_normaliser,
    key_scales,
    log_floor,
    prepare_linear_inputs,
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


#: bound on the elements of the (chunks, C, span) score temporaries of one block of chunks
_BAND_BLOCK_ELEMENTS = 1 << 18


def _window_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    band: Tensor,
    before: int,
    *,
    s: Tensor | None = None,
    r: Tensor | None = None,
    far_kv: Tensor | None = None,
    far_z: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``num_p = Σ_x band[p, x] (fq_p·fk_x) [exp(s_x − r_p)] v_x`` over the window of each
    query chunk and ``den_p``, the same without ``v_x`` (plus ``fq_p·far_kv_t`` and
    ``fq_p·far_z_t`` when far-field sums are given).

    Window t holds the keys ``t·C − before … t·C − before + span − 1`` (zeros outside the
    sequence). Chunks are processed in blocks so that the score temporaries stay small.

    Args:
        fq: ``(B, H, n·C, M)``; fk: ``(B, H, Lk, M)``; v: ``(B, H, Lk, Dv)``.
        band: ``(H, C, span)`` coefficients.
        s: ``(B, H, Lk)`` key log-scales and r: ``(B, H, n·C)`` query offsets, or None.
        far_kv: ``(B, H, n, M, Dv)`` and far_z: ``(B, H, n, M)``, or None.

    Returns:
        ``num (B, H, n·C, Dv)`` and ``den (B, H, n·C, 1)``.
    """
    b, h, lq, _ = fq.shape
    c, span = band.shape[1:]
    n = lq // c
    total = (n - 1) * c + span
    pad = (before, max(0, total - before - fk.shape[2]))
    if pad != (0, 0):
        fk, v = F.pad(fk, (0, 0, *pad)), F.pad(v, (0, 0, *pad))
        if s is not None:
            s = F.pad(s, pad, value=log_floor(s.dtype))
    grad = torch.is_grad_enabled()
    per_block = max(1, _BAND_BLOCK_ELEMENTS // (b * h * c * span))
    chunks = fq.unflatten(2, (n, c))  # (B, H, n, C, M)
    # the far-field part of every chunk first; blocks of the band add to it
    if far_kv is not None and far_z is not None:
        num, den = chunks @ far_kv, chunks @ far_z[..., None]
    else:
        num, den = fq.new_zeros(b, h, n, c, v.shape[-1]), fq.new_zeros(b, h, n, c, 1)
    parts: list[tuple[Tensor, Tensor]] = []
    for t0 in range(0, n, per_block):
        t1 = min(n, t0 + per_block)
        keys = slice(t0 * c, (t1 - 1) * c + span)
        fk_w = fk[:, :, keys].unfold(2, span, c)  # (B, H, nb, M, span)
        v_w = v[:, :, keys].unfold(2, span, c).transpose(-1, -2)  # (B, H, nb, span, Dv)
        scores = chunks[:, :, t0:t1] @ fk_w  # (B, H, nb, C, span)
        if s is not None and r is not None:
            s_w = s[:, :, keys].unfold(2, span, c)  # (B, H, nb, span)
            r_b = r[:, :, t0 * c : t1 * c].unflatten(2, (t1 - t0, c))  # (B, H, nb, C)
            weight = exp_nonpositive(s_w[..., None, :] - r_b[..., None])
            scores = scores * weight if grad else scores.mul_(weight)
        weight = band[:, None]  # (H, 1, C, span)
        if grad:
            scores = scores * weight
            parts.append((scores @ v_w, scores.sum(dim=-1, keepdim=True)))
        else:
            scores = scores.mul_(weight)
            num[:, :, t0:t1].add_(scores @ v_w)
            den[:, :, t0:t1].add_(scores.sum(dim=-1, keepdim=True))
    if parts:
        num = num + torch.cat([p[0] for p in parts], dim=2)
        den = den + torch.cat([p[1] for p in parts], dim=2)
    return num.flatten(2, 3), den.flatten(2, 3)


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
    if causal:
        num, den = _causal_banded(fq, fk, v32, s, log_coeff, left, c, -(-lq // c), block_size)
    else:
        # query chunks C with C + left + right − 2 = k·C − (slack): the window of each chunk is
        # k whole chunks; pick C near chunk_size that wastes the least of the window
        reach = left + right - 2
        if reach > c:  # a window of k chunks: C = ⌈reach / (k − 1)⌉ wastes the least
            k = -(-reach // c) + 1
            c = max(1, min(lq, -(-reach // (k - 1))))
        num, den = _bidirectional_banded(fq, fk, v32, s, log_coeff, left, c, -(-lq // c))
    num, den = num.reshape(b, h, -1, dv)[:, :, :lq], den.reshape(b, h, -1, 1)[:, :, :lq]
    guard: float | Tensor = eps
    # the sums are in units of the largest coefficient and key log-scale, apart: the guard is
    # measured in each query's own (its largest visible weight), which only a normaliser
    # below eps in the shared units can tell apart
    if bool((den.detach().abs() < eps).any()):
        units = _row_log_units(log_coeff, left, s, key_padding_mask, lq, lk, causal)
        guard = guard_in_units(eps, units)
    return (num / guard_normaliser(den, guard)).to(v.dtype)


def _row_log_units(
    log_coeff: Tensor,
    left: int,
    s: Tensor | None,
    key_padding_mask: Tensor | None,
    lq: int,
    lk: int,
    causal: bool,
) -> Tensor:
    """``(B or 1, H, Lq)``: the log of the largest weight ``c_{j−i} exp(s_j)`` each query sees
    (−∞-like where none), less the units of the path's sums: the largest coefficient (the
    past's when causal) plus the largest key log-scale (causal: of the keys so far)."""
    log_coeff = log_coeff.detach()
    right = log_coeff.shape[-1] - 1 - left
    floor = log_floor(log_coeff.dtype)
    if lk == 0:
        return log_coeff.new_zeros(1, 1, lq)
    past = log_coeff[:, : left + 1] if causal else log_coeff
    units = past.amax(dim=-1)[None, :, None]  # (1, H, 1)
    scaled = s is not None
    if s is None:
        s = log_coeff.new_zeros(1, 1, lk)
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, :], floor)
    s = s.detach()
    so_far = torch.cummax(s, dim=-1).values  # the largest key log-scale up to each key
    if scaled:
        units = units + (so_far if causal else so_far[..., -1:])
    coeff = log_coeff[None, :, :, None]  # (1, H, K, 1)
    # the far fields: the largest key log-scale up to i − left (and from i + right)
    so_far = torch.cat([so_far, so_far[..., -1:].expand(*s.shape[:2], max(0, lq - lk))], -1)
    best = F.pad(so_far, (left, 0), value=floor)[..., :lq] + coeff[:, :, 0]
    if not causal:
        after = torch.cummax(s.flip(-1), dim=-1).values.flip(-1)
        after = F.pad(after[..., right:], (0, max(0, lq - lk + right)), value=floor)[..., :lq]
        best = torch.maximum(best, after + coeff[:, :, -1])
    # the band, an offset at a time: key i + o for query i
    keys = F.pad(s, (left, max(0, lq + right - lk)), value=floor)  # key j at left + j
    for o in range(-(left - 1), 1 if causal else right):
        best = torch.maximum(best, keys[..., left + o : left + o + lq] + coeff[:, :, left + o])
    return best - units


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
    _, _, lq, m = fq.shape
    lk, dv = fk.shape[2], v.shape[-1]
    right = log_coeff.shape[-1] - 1 - left
    coeff = torch.exp(log_coeff - log_coeff.detach().amax(dim=-1, keepdim=True))  # (H, K)
    # window of chunk t: keys t·C − (left−1) ... , a whole number k of key chunks; in padded
    # coordinates (``before`` zeros first) it is key chunks t … t+k−1
    before = left - 1
    k = -(-(c + left + right - 2) // c)
    n_keys = max(n + k - 1, -(-(lk + before) // c))
    n_keys = -(-n_keys // _SCAN_GROUP) * _SCAN_GROUP  # whole groups for the scan
    keys = slice(before, before + lk)
    scale = None if s is None else key_scales(s)[..., None]
    fk_pad = _zero_padded(fk, keys, n_keys * c, scale=scale)
    v_pad = _zero_padded(v, keys, n_keys * c)
    # far field: key chunks entirely left (right) of the window, by prefix (suffix) sums
    fk_chunks = fk_pad.unflatten(2, (n_keys, c))  # (B, H, n_keys, C, M)
    chunk_kv = fk_chunks.transpose(-1, -2) @ v_pad.unflatten(2, (n_keys, c))  # (.., M, Dv)
    cl, cr = coeff[:, 0, None, None], coeff[:, -1, None, None]
    far = []
    for sums in (chunk_kv.flatten(3), fk_chunks.sum(dim=3)):  # Σ φ(k) vᵀ and Σ φ(k)
        prefix, suffix = _prefix_and_suffix_sums(sums)  # chunks < t, chunks >= t
        suffix = F.pad(suffix[:, :, k : k + n], (0, 0, 0, max(0, n - (n_keys - k))))
        far.append((prefix[:, :, :n] * cl).addcmul_(suffix, cr))
    far_kv, far_z = far[0].unflatten(3, (m, dv)), far[1]
    band = _band_matrix(coeff, left, c, k * c, before)  # (H, C, span): the exact band
    fq = F.pad(fq, (0, 0, 0, n * c - lq))
    return _window_sums(fq, fk_pad, v_pad, band, 0, far_kv=far_kv, far_z=far_z)


def _zero_padded(
    x: Tensor,
    keys: slice,
    length: int,
    *,
    scale: Tensor | None = None,
) -> Tensor:
    """``x (B, H, L, F)`` (times ``scale`` if given) at positions ``keys`` of a zero tensor of
    ``length`` positions; only the padding is zero-filled."""
    b, h, _, f = x.shape
    out = x.new_empty(b, h, length, f)
    out[:, :, : keys.start].zero_()
    out[:, :, keys.stop :].zero_()
    inside = out[:, :, keys]
    if scale is None:
        inside.copy_(x)
    elif torch.is_grad_enabled():
        inside.copy_(x * scale)
    else:
        torch.mul(x, scale, out=inside)
    return out


#: entries per group of the blocked scan in :func:`_prefix_and_suffix_sums`
_SCAN_GROUP = 8


def _prefix_and_suffix_sums(x: Tensor, group: int = _SCAN_GROUP) -> tuple[Tensor, Tensor]:
    """``Σ_{u' < u} x_u'`` and ``Σ_{u' >= u} x_u'`` along dim 2 of ``x (B, H, U, F)``.

    A blocked scan: triangular matmuls inside groups of ``group`` entries and cumulative
    sums over the group totals (much faster on CPU than ``cumsum`` along a middle dim).
    """
    b, h, u, f = x.shape
    g = -(-u // group)
    if g * group != u:
        x = F.pad(x, (0, 0, 0, g * group - u))
    xs = x.view(b, h, g, group, f)
    ones = torch.ones(group, group, device=x.device, dtype=x.dtype)
    tri = torch.cat([ones.tril(-1), ones.triu()], dim=0)  # (2·group, group)
    within = tri @ xs  # (B, H, g, 2·group, F): exclusive prefix, inclusive suffix in the group
    totals = xs.sum(dim=3)  # (B, H, g, F)
    before = F.pad(totals.cumsum(dim=2), (0, 0, 1, 0))[:, :, :g]  # groups before
    after = F.pad(totals.flip(2).cumsum(dim=2), (0, 0, 1, 0))[:, :, :g].flip(2)  # groups after
    prefix = (within[:, :, :, :group] + before[:, :, :, None]).reshape(b, h, g * group, f)
    suffix = (within[:, :, :, group:] + after[:, :, :, None]).reshape(b, h, g * group, f)
    return prefix[:, :, :u], suffix[:, :, :u]


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
    lq = fq.shape[2]
    past = log_coeff[:, : left + 1]  # offsets −left…0
    coeff = torch.exp(past - past.detach().amax(dim=-1, keepdim=True))  # (H, left+1)
    # far keys j <= i − left, weighted c_L: causal linear attention over the keys delayed by
    # `left` positions (kept apart from the band, so a large c_L cancels nothing)
    delay = min(left, lq)
    fk_far, v_far = (delayed(x, delay) for x in (fk, v))  # Lk == Lq: causal
    s_far = None if s is None else delayed(s, delay, log_floor(s.dtype))
    num, den, r_far, _ = causal_linear_sums(
        fq, fk_far, v_far, s_far, chunk_size=c, block_size=block_size
    )
    c_left = coeff[:, 0][None, :, None, None]
    r = None
    if s is not None and r_far is not None:
        # one offset per query for both parts: the running maximum of every key so far
        r = torch.cummax(s.detach(), dim=-1).values
        c_left = c_left * exp_nonpositive(r_far - r)[..., None]
    num, den = num * c_left, den * c_left
    # the band i − left < j <= i with its own coefficients, in the offsets r_i
    before = left - 1
    span = c + before
    band = F.pad(coeff[:, 1:], (1, 1))  # offsets −left…1: 0 at −left (far) and at 1 (future)
    band = _band_matrix(band, left, c, span, before)  # (H, C, span)
    padded = (0, n * c - lq)
    band_num, band_den = _window_sums(
        F.pad(fq, (0, 0, *padded)),
        fk,
        v,
        band,
        before,
        s=s,
        r=None if r is None else F.pad(r, padded),
    )
    return num + band_num[:, :, :lq], den + band_den[:, :, :lq]
