"""Pieces of the Nyström family (Skyformer, Nyströmformer): the iterative pseudo-inverse.

:func:`iterative_pinv` is the third-order hyper-power (Newton–Schulz type) iteration of
Razavi et al. used by Nyströmformer and Skyformer:
``Z ← ¼ Z (13I − MZ (15I − MZ (7I − MZ)))`` from ``Z₀ = Mᵀ / (‖M‖₁ ‖M‖_∞)``, which converges
to ``M⁺`` for any M because ``‖I − M Z₀‖ < 1`` on the range of M.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
