"""The Nyström family's attention cores: Skyformer (on the Gaussian kernel) and Nyströmformer
(on softmax), with their landmarks; the pseudo-inverse is in :mod:`kattn.functional.pinv`."""

from __future__ import annotations

import torch
from torch import Tensor

from .gaussian import gaussian_kernel, gaussian_product
from .numerics import accumulation_dtype, without_autocast
from .pinv import PINV_INITS, iterative_pinv, iterative_pinv_solve
from .softmax import softmax_attention

__all__ = [
    "PINV_INITS",
    "iterative_pinv",
    "iterative_pinv_solve",
    "nystromformer_attention",
    "nystromformer_attention_reference",
    "segment_means",
    "skyformer_attention",
]


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
    acc = accumulation_dtype(v.dtype)
    b, h, lq, d = q.shape
    scale = d**-0.25  # κ(Q/p^¼, K/p^¼): applied inside the kernels (on the landmark side)
    xq, xk = q.to(acc), k.to(acc)
    if key_padding_mask is not None:  # padded rows zeroed, so not even a NaN there counts
        pad = key_padding_mask[:, None, :, None]
        xk = xk.masked_fill(pad, 0.0)
        if lq == k.shape[2]:  # self-attention: the same positions are padded queries
            xq = xq.masked_fill(pad, 0.0)
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
        keep = landmark_mask[:, None, :, None].to(acc)  # (B, 1, S, 1)
        core = core * keep * keep.transpose(-1, -2) + eye * (1 - keep)
    core = core + gamma * eye
    vv = v.to(acc)
    if key_padding_mask is not None:  # padded keys: zero values (their kernel rows then count
        vv = vv.masked_fill(key_padding_mask[:, None, :, None], 0.0)  # nothing, nor get grads)
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
    q32, k32, v32 = q.to(acc) * scale, k.to(acc) * scale, v.to(acc)
    keys_ok = None if key_padding_mask is None else ~key_padding_mask
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :, None]
        k32, v32 = k32.masked_fill(pad, 0.0), v32.masked_fill(pad, 0.0)
    queries_ok = keys_ok if lq == lk else None
    q_land, q_land_ok = segment_means(q32, min(num_landmarks, lq), queries_ok)
    k_land, k_land_ok = segment_means(k32, min(num_landmarks, lk), keys_ok)
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
