"""Pieces of the Nyström family (Skyformer, Nyströmformer): the iterative pseudo-inverse.

:func:`iterative_pinv` is the third-order hyper-power (Newton–Schulz type) iteration of
Razavi et al. used by Nyströmformer and Skyformer:
``Z ← ¼ Z (13I − MZ (15I − MZ (7I − MZ)))`` from ``Z₀ = Mᵀ / (‖M‖₁ ‖M‖_∞)``, which converges
to ``M⁺`` for any M because ``‖I − M Z₀‖ < 1`` on the range of M.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gaussian import gaussian_kernel
from .numerics import accumulation_dtype

#: ``init`` options of :func:`iterative_pinv`.
PINV_INITS = ("per_matrix", "global")


def iterative_pinv(m: Tensor, iterations: int = 6, *, init: str = "per_matrix") -> Tensor:
    """Approximate pseudo-inverse of each ``(..., n, n)`` matrix by the hyper-power iteration.

    Args:
        m: ``(..., n, n)`` matrices (computed in fp32 at least).
        iterations: number of updates (6 in Nyströmformer and Skyformer).
        init: ``"per_matrix"`` scales ``Z₀ = Mᵀ / (‖M‖₁‖M‖_∞)`` per matrix (convergent for
            every matrix); ``"global"`` uses the released code's single maximum column sum over
            the whole batch, ``Z₀ = Mᵀ / max colsum`` (for comparing with published numbers;
            it can diverge for matrices far from the largest one).

    Returns:
        ``(..., n, n)`` in the accumulation dtype of ``m``.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative int, got {iterations!r}")
    if init not in PINV_INITS:
        raise ValueError(f"init must be one of {PINV_INITS}, got {init!r}")
    if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
        raise ValueError(f"m must be (..., n, n), got shape {tuple(m.shape)}")
    m = m.to(torch.promote_types(m.dtype, torch.float32))
    abs_m = m.abs()
    col = abs_m.sum(dim=-2).amax(dim=-1)  # ‖M‖₁, (...)
    if init == "global":
        scale = m.sum(dim=-2).amax()
    else:
        scale = col * abs_m.sum(dim=-1).amax(dim=-1)  # ‖M‖₁ ‖M‖_∞
        scale = scale[..., None, None]
    z = m.transpose(-1, -2) / scale
    eye = torch.eye(m.shape[-1], device=m.device, dtype=m.dtype)
    for _ in range(iterations):
        mz = m @ z
        z = 0.25 * z @ (13 * eye - mz @ (15 * eye - mz @ (7 * eye - mz)))
    return z


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
    init: str = "per_matrix",
) -> Tensor:
    """Skyformer (seed 003 §4.2): ``C̄_{Q,S} (C̄_{S,S} + γI)^{-1} C̄_{S,K} V`` in O(L·S).

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
        iterations, init: of :func:`iterative_pinv`; ``iterations=None`` inverts exactly.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    acc = accumulation_dtype(v.dtype)
    b, h, lq, d = q.shape
    scale = d**-0.25
    x = torch.cat([q, k], dim=2).to(acc) * scale  # (B, H, Lq+Lk, D)
    index = landmarks[:, None, :, None].expand(b, h, landmarks.shape[1], d)
    xs = x.gather(2, index)  # (B, H, S, D)
    a_q = gaussian_kernel(x[:, :, :lq], xs)  # (B, H, Lq, S)
    a_k = gaussian_kernel(x[:, :, lq:], xs)  # (B, H, Lk, S)
    core = gaussian_kernel(xs, xs)  # (B, H, S, S)
    eye = torch.eye(core.shape[-1], device=core.device, dtype=core.dtype)
    if landmark_mask is not None:
        # ignored landmarks: zero columns, and an identity block that touches nothing else
        keep = landmark_mask[:, None, None, :].to(acc)
        a_q, a_k = a_q * keep, a_k * keep
        core = core * keep * keep.transpose(-1, -2) + eye * (1 - keep)
    core = core + gamma * eye
    vv = v.to(acc)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :, None]
        a_k = a_k.masked_fill(pad, 0.0)
        vv = vv.masked_fill(pad, 0.0)
    if iterations is None:
        inverse = torch.linalg.inv(core)
    else:
        d_half = core.sum(dim=-1).rsqrt()  # D^{-½}
        pre = d_half[..., :, None] * core * d_half[..., None, :]
        inverse = d_half[..., :, None] * iterative_pinv(pre, iterations, init=init)
        inverse = inverse * d_half[..., None, :]
    return (a_q @ (inverse @ (a_k.transpose(-1, -2) @ vv))).to(v.dtype)
