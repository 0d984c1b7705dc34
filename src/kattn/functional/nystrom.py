"""The Nyström family's attention cores: Skyformer (on the Gaussian kernel) and Nyströmformer
(on softmax), with their landmarks; the pseudo-inverse is in :mod:`kattn.functional.pinv`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .gaussian import gaussian_kernel, gaussian_product
from .numerics import accumulation_dtype, without_autocast, zero_padded
from .pinv import PINV_INITS, iterative_pinv, iterative_pinv_solve
from .softmax import softmax_attention

__all__ = [
    "PINV_INITS",
    "iterative_pinv",
    "iterative_pinv_solve",
    "nystromformer_attention",
    "nystromformer_attention_reference",
    "nystromformer_conv_skip",
    "nystromformer_conv_skip_reference",
    "segment_means",
    "skyformer_attention",
    "skyformer_attention_reference",
    "skyformer_landmarks",
]


def skyformer_landmarks(
    batch: int,
    lq: int,
    lk: int,
    uniforms: tuple[Tensor, Tensor] | None,
    *,
    key_padding_mask: Tensor | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Skyformer's landmarks (Chen et al. 2021 §4.2): rows of ``[Q; K]`` drawn uniformly with
    replacement, given as indices ``(B, S)`` into its ``Lq + Lk`` rows and their validity.

    ``uniforms = (u_q (B, Sq), u_k (B, Sk))`` in [0, 1) pick, for ``r = ⌊u·n⌋``, the r-th of
    the n allowed query rows and of the n allowed key rows (S = Sq + Sk); None makes every row
    a landmark (S = Lq + Lk). Allowed keys are the non-padded ones; with Lq == Lk
    (self-attention) the padding mask marks padded queries too. A batch row with no allowed
    row draws among all its rows (those landmarks are then invalid), so the same uniforms
    give the same landmarks with no mask and with a mask that allows everything.

    Args:
        batch: B; lq, lk: the lengths Lq and Lk.
        uniforms: ``(u_q, u_k)``, or None for every row.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.
        device: of the indices when there is no mask.

    Returns:
        The indices ``(B, S)`` and their validity ``(B, S)`` bool (False: a padded row).
    """
    keys_ok = torch.ones(batch, lk, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        keys_ok = ~key_padding_mask
    queries_ok = keys_ok if lq == lk else torch.ones(batch, lq, dtype=torch.bool, device=device)
    valid = torch.cat([queries_ok, keys_ok], dim=1)  # (B, Lq+Lk)
    if uniforms is None:  # every row
        index = torch.arange(lq + lk, device=device).expand(batch, -1)
        return index, valid
    padded = key_padding_mask is not None
    parts = [
        _uniform_rows(rows if padded else None, u, length) + start
        for rows, u, length, start in (
            (queries_ok, uniforms[0], lq, 0),
            (keys_ok, uniforms[1], lk, lq),
        )
    ]
    index = torch.cat(parts, dim=1)
    return index, valid.gather(1, index)


def _uniform_rows(allowed: Tensor | None, u: Tensor, length: int) -> Tensor:
    """Row indices ``(B, count)`` for uniforms ``u (B, count)`` in [0, 1): the r-th of the
    ``allowed (B, L)`` rows for ``r = ⌊u·n_allowed⌋`` (all L rows when None, or when a batch row
    has none), so the draws are the same with no mask and with a mask that allows everything."""
    if allowed is None:
        return (u * length).long().clamp_(max=length - 1)
    n_ok = allowed.sum(dim=1, keepdim=True)
    n_ok = torch.where(n_ok == 0, length, n_ok)
    r = (u * n_ok).long().minimum(n_ok - 1)  # the r-th allowed row (0-based)
    cum = torch.where(allowed.any(dim=1, keepdim=True), allowed, True).long().cumsum(dim=1)
    return torch.searchsorted(cum, r + 1)


@without_autocast
def skyformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    landmarks: Tensor,
    *,
    landmark_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    gamma: float = 0.1,
    iterations: int | None = 6,
    init: str = "identity",
) -> Tensor:
    """Skyformer (Chen et al. 2021 §4.2): ``C̄_{Q,S} (C̄_{S,S} + γI)^{-1} C̄_{S,K} V`` in O(L·S).

    ``C̄ = κ(X, X)`` is the Gaussian kernel on ``X = [Q; K]/p^¼`` (the PSD completion of the
    query–key kernel), S the landmark rows of X. ``(C̄_{S,S} + γI)^{-1}`` is computed on the
    preconditioned ``D^{-½}(C̄_{S,S} + γI)D^{-½}`` (D its row sums) by :func:`iterative_pinv`,
    or exactly (``iterations=None``). No row normalisation, like the exact ``gaussian``.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        landmarks: ``(B, S)`` indices into the ``Lq + Lk`` rows of ``[Q; K]`` (shared by heads).
        landmark_mask: ``(B, S)`` bool, False for landmarks to ignore (padding), or None.
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that must not count.
        gamma: the ridge γ added to ``C̄_{S,S}``.
        iterations, init: of :func:`iterative_pinv`; ``iterations=None`` inverts exactly. The
            identity start (§4.4) converges here: the preconditioned core has
            ``‖I − M‖ < 1`` (Lemma 3).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    b, h, lq, d = q.shape
    scale = d**-0.25  # κ(Q/p^¼, K/p^¼): applied inside the kernels (on the landmark side)
    xq, xk, vv = _skyformer_inputs(q, k, v, key_padding_mask)
    # the landmark rows of [Q; K], gathered from each without forming [Q; K]
    index = landmarks[:, None, :, None].expand(b, h, landmarks.shape[1], d)
    from_q = xq.gather(2, index.clamp(max=lq - 1))
    from_k = xk.gather(2, (index - lq).clamp(min=0))
    xs = torch.where(index < lq, from_q, from_k)  # (B, H, S, D)
    core = gaussian_kernel(xs, xs, scale=scale)  # (B, H, S, S)
    eye = torch.eye(core.shape[-1], device=core.device, dtype=core.dtype)
    keep = None
    if landmark_mask is not None:
        # ignored landmarks: zero columns of C̄_{Q,S} and rows of C̄_{S,K}, and an identity
        # block of the core that touches nothing else
        keep = landmark_mask[:, None, :, None].to(xs.dtype)  # (B, 1, S, 1)
        core = core * keep * keep.transpose(-1, -2) + eye * (1 - keep)
    core = core + gamma * eye
    # C̄_{S,K} V and C̄_{Q,S} W, each fused: one (L, S) kernel each is kept for backward
    summary = gaussian_product(xk, xs, vv, transpose=True, scale=scale)  # (B, H, S, Dv)
    if keep is not None:
        summary = summary * keep
    if iterations is None:
        weights = torch.linalg.solve(core, summary)
    else:  # (M+γI)^{-1} = D^{-½} pinv(D^{-½}(M+γI)D^{-½}) D^{-½}, D the row sums
        d_half = core.sum(dim=-1, keepdim=True).rsqrt()  # (B, H, S, 1)
        pre = d_half * core * d_half.transpose(-1, -2)
        weights = d_half * iterative_pinv_solve(pre, d_half * summary, iterations, init=init)
    if keep is not None:
        weights = weights * keep
    return gaussian_product(xq, xs, weights, scale=scale).to(v.dtype)


def skyformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    landmarks: Tensor,
    *,
    landmark_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    gamma: float = 0.1,
    iterations: int | None = 6,
    init: str = "identity",
) -> Tensor:
    """:func:`skyformer_attention` with explicit matrices (slow; for tests): ``[Q; K]`` formed
    and its landmark rows S gathered, the kernels ``C̄_{Q,S}``, ``C̄_{S,S}``, ``C̄_{S,K}`` as
    matrices, and the inverse formed as a matrix: ``D^{-½} pinv(D^{-½}(C̄_{S,S} + γI)D^{-½})
    D^{-½}`` by the same hyper-power iteration that defines the fast output (D the row sums;
    Skyformer's preconditioning), or ``torch.linalg.inv`` when ``iterations`` is None.

    Arguments and result as for :func:`skyformer_attention`.
    """
    b, h, _, d = q.shape
    scale = d**-0.25
    xq, xk, vv = _skyformer_inputs(q, k, v, key_padding_mask)
    acc = vv.dtype
    x = torch.cat([xq, xk], dim=2)  # [Q; K], (B, H, Lq+Lk, D)
    xs = x.gather(2, landmarks[:, None, :, None].expand(b, h, -1, d))  # (B, H, S, D)
    ok = torch.ones_like(landmarks, dtype=torch.bool) if landmark_mask is None else landmark_mask
    keep = ok[:, None, :, None].to(acc)  # (B, 1, S, 1): landmarks that count
    c_qs = gaussian_kernel(xq, xs, scale=scale) * keep.transpose(-1, -2)  # (B, H, Lq, S)
    c_sk = gaussian_kernel(xs, xk, scale=scale) * keep  # (B, H, S, Lk)
    eye = torch.eye(xs.shape[2], device=xs.device, dtype=acc)
    # ignored landmarks get an identity block that touches nothing else
    core = gaussian_kernel(xs, xs, scale=scale) * keep * keep.transpose(-1, -2)
    core = core + eye * (1 - keep) + gamma * eye  # (B, H, S, S)
    if iterations is None:
        inverse = torch.linalg.inv(core)
    else:
        d_half = core.sum(dim=-1, keepdim=True).rsqrt()  # (B, H, S, 1)
        pre = d_half * core * d_half.transpose(-1, -2)
        inverse = d_half * iterative_pinv(pre, iterations, init=init)
        inverse = inverse * d_half.transpose(-1, -2)
    return (c_qs @ inverse @ c_sk @ vv).to(v.dtype)


def _skyformer_inputs(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v in the accumulation dtype of v, with the padded keys and values zeroed (and, in
    self-attention, Lq == Lk, the padded queries): not even a NaN stored there then counts,
    and a padded key's kernel row meets a zero value, so it gets no gradient either."""
    acc = accumulation_dtype(v.dtype)
    xk, vv = zero_padded(key_padding_mask, k.to(acc), v.to(acc))
    xq = q.to(acc)
    if q.shape[2] == k.shape[2]:  # the same positions are padded queries
        (xq,) = zero_padded(key_padding_mask, xq)
    return xq, xk, vv


def segment_means(x: Tensor, count: int, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Landmarks of Nyströmformer: means of ``count`` consecutive segments of ``x (B, H, L, D)``.

    With L = q·count + r the first ``count − r`` segments hold q tokens and the last r hold
    q + 1 (every token belongs to one segment). ``valid (B, L)`` bool leaves tokens out of
    the means; a segment without valid tokens gives a zero landmark, marked invalid.

    Returns:
        ``(B, H, count, D)`` and the validity ``(B, count)``.
    """
    b, h, length, d = x.shape
    if not 1 <= count <= length:
        raise ValueError(f"count must be in [1, L={length}], got {count}")
    base, extra = divmod(length, count)
    if extra == 0 and valid is None:  # equal segments: a reshape
        means = x.reshape(b, h, count, base, d).mean(dim=3)
        return means, torch.ones(b, count, dtype=torch.bool, device=x.device)
    sizes = torch.full((count,), base, device=x.device)
    sizes[count - extra :] += 1
    segment = torch.repeat_interleave(torch.arange(count, device=x.device), sizes)  # (L,)
    weight = torch.ones(b, length, device=x.device, dtype=x.dtype)
    if valid is not None:
        weight = weight * valid.to(x.dtype)
    x = x * weight[:, None, :, None]  # padded tokens count nothing (not even a NaN)
    x = x.nan_to_num(0.0) if valid is not None else x
    sums = x.new_zeros(b, h, count, d).index_add_(2, segment, x)
    counts = weight.new_zeros(b, count).index_add_(1, segment, weight)
    means = sums / counts.clamp_min(1.0)[:, None, :, None]
    return means, counts > 0


def _masked_softmax(logits: Tensor, keep: Tensor | None) -> Tensor:
    """Softmax over the last dim with ``keep`` (broadcastable bool) columns only; rows with
    none give zeros."""
    if keep is None:
        return torch.softmax(logits, dim=-1)
    logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1) * keep.any(dim=-1, keepdim=True)


def _landmarks(
    q: Tensor, k: Tensor, v: Tensor, num_landmarks: int, key_padding_mask: Tensor | None
) -> tuple[Tensor, ...]:
    """Nyströmformer's inputs in the accumulation dtype (q, k scaled by ``D^{-¼}``, padded
    keys and values zeroed, so that not even a NaN or Inf there counts through a zero
    weight) and its segment-mean landmarks with their validity."""
    acc = accumulation_dtype(v.dtype)
    lq, d = q.shape[2:]
    lk = k.shape[2]
    scale = d**-0.25
    q32 = q.to(acc) * scale
    k32, v32 = zero_padded(key_padding_mask, k.to(acc) * scale, v.to(acc))
    keys_ok = None if key_padding_mask is None else ~key_padding_mask
    queries_ok = keys_ok if lq == lk else None
    # one count for both sides: the middle kernel softmax(Q̃ K̃ᵀ) is square, and inverted
    count = min(num_landmarks, lq, lk)
    q_land, q_land_ok = segment_means(q32, count, queries_ok)
    k_land, k_land_ok = segment_means(k32, count, keys_ok)
    return q32, k32, v32, q_land, q_land_ok, k_land, k_land_ok


@without_autocast
def nystromformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    num_landmarks: int,
    *,
    key_padding_mask: Tensor | None = None,
    iterations: int = 6,
    init: str = "per_matrix",
) -> Tensor:
    """Nyströmformer (Xiong et al. 2021): ``softmax(Q K̃ᵀ) pinv(softmax(Q̃ K̃ᵀ)) softmax(Q̃ Kᵀ) V``
    with segment-mean landmarks Q̃, K̃ and logits scaled by ``1/√D``.

    Padded keys count nowhere: not in the key landmarks, not in the third kernel; with
    Lq == Lk (self-attention) padded positions are left out of the query landmarks too.
    Landmarks without any valid token are masked out of the first two kernels.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        num_landmarks: m (capped at the lengths).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.
        iterations, init: of :func:`iterative_pinv` (not ``"identity"``, which diverges on a
            softmax kernel: it is not close to I).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    acc = accumulation_dtype(v.dtype)
    q32, k32, v32, q_land, q_land_ok, k_land, k_land_ok = _landmarks(
        q, k, v, num_landmarks, key_padding_mask
    )
    # landmarks without a valid token exist only with padding (no host sync without it)
    land_keep = None if key_padding_mask is None else k_land_ok[:, None, None, :]  # (B,1,1,m)
    land_pad = None if key_padding_mask is None else ~k_land_ok  # (B, m)
    kernel_2 = _masked_softmax(q_land @ k_land.transpose(-1, -2), land_keep)  # (B, H, m, m)
    # The two long kernels are softmax attentions: m landmark queries over the Lk keys, and the
    # Lq queries over the m landmark keys (fused, never an (Lq, m) or (m, Lk) matrix kept).
    summary = softmax_attention(q_land, k32, v32, key_padding_mask=key_padding_mask, scale=1.0)
    if key_padding_mask is not None:  # landmarks of padding only: zero rows of kernel 3
        summary = summary * q_land_ok[:, None, :, None].to(acc)
    weights = iterative_pinv_solve(kernel_2, summary, iterations, init=init)
    out = softmax_attention(q32, k_land, weights, key_padding_mask=land_pad, scale=1.0)
    return out.to(v.dtype)


@without_autocast
def nystromformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    num_landmarks: int,
    *,
    key_padding_mask: Tensor | None = None,
    iterations: int = 6,
    init: str = "per_matrix",
) -> Tensor:
    """:func:`nystromformer_attention` with its three kernels as explicit matrices (for tests)."""
    acc = accumulation_dtype(v.dtype)
    q32, k32, v32, q_land, q_land_ok, k_land, k_land_ok = _landmarks(
        q, k, v, num_landmarks, key_padding_mask
    )
    land_keep = k_land_ok[:, None, None, :]
    kernel_1 = _masked_softmax(q32 @ k_land.transpose(-1, -2), land_keep)  # (B, H, Lq, m)
    kernel_2 = _masked_softmax(q_land @ k_land.transpose(-1, -2), land_keep)  # (B, H, m, m)
    key_keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    kernel_3 = _masked_softmax(q_land @ k32.transpose(-1, -2), key_keep)  # (B, H, m, Lk)
    kernel_3 = kernel_3 * q_land_ok[:, None, :, None].to(acc)
    inverse = iterative_pinv(kernel_2, iterations, init=init)
    return (kernel_1 @ (inverse @ (kernel_3 @ v32))).to(v.dtype)


def nystromformer_conv_skip(v: Tensor, weight: Tensor) -> Tensor:
    """Nyströmformer's convolution skip (Xiong et al. 2021, the released code): a depthwise 1-D
    convolution of the values along the sequence, ``skip_i = Σ_t w_t v_{i+t−⌊size/2⌋}`` (zero
    beyond the ends), one filter per head shared by the value channels. O(L·size·Dv).

    Args:
        v: ``(B, H, L, Dv)``, padded positions already zeroed.
        weight: ``(H, 1, size, 1)``, size odd.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of ``v``.
    """
    size = weight.shape[2]
    return F.conv2d(v, weight.to(v.dtype), padding=(size // 2, 0), groups=v.shape[1])


def nystromformer_conv_skip_reference(v: Tensor, weight: Tensor) -> Tensor:
    """:func:`nystromformer_conv_skip` as a banded ``(L, L)`` matrix per head (slow; for tests):
    entry ``(i, j)`` is ``w[j − i + ⌊size/2⌋]`` over the offsets the filter covers."""
    size = weight.shape[2]
    positions = torch.arange(v.shape[2], device=v.device)
    tap = positions[None, :] - positions[:, None] + size // 2  # (L, L)
    inside = (tap >= 0) & (tap < size)
    taps = weight[:, 0, :, 0].to(v.dtype)  # (H, size)
    band = taps[:, tap.clamp(0, size - 1)] * inside  # (H, L, L)
    return torch.einsum("hij,bhjd->bhid", band, v)
