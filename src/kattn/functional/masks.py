"""Masks shared by the attention maths: which keys each query may see."""

from __future__ import annotations

import torch
from torch import Tensor


def allowed_keys(
    lq: int,
    lk: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device,
) -> Tensor | None:
    """Bool mask of visible keys, broadcastable to ``(B, H, Lq, Lk)``; None if all are visible.

    True means "query i may attend to key j": j is not padding and, when ``causal``, j <= i.
    """
    allowed: Tensor | None = None
    if causal:
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Lk)
        allowed = keep if allowed is None else keep & allowed
    return allowed
