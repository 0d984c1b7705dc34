"""Exact softmax attention, ``softmax(q kᵀ · scale) v`` (Vaswani et al., 2017). O(Lq·Lk·D)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import allowed_keys


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact softmax attention through :func:`torch.nn.functional.scaled_dot_product_attention`.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        causal: query i sees keys j <= i (Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding: those keys and values count
            nowhere (they are zeroed first, so not even a NaN or an infinity stored there
            reaches an output or a gradient through ``0 × NaN``).
        scale: logit scale, default ``1/√D``.
        dropout_p: dropout on the attention weights (pass 0 in evaluation).

    Returns:
        ``(B, H, Lq, Dv)``. A query that sees no key at all (fully padded) gets zeros, not NaN.
    """
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p
        )
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    assert allowed is not None
    k, v = _zero_padded(k, v, key_padding_mask)
    # A row with no visible key would be softmax over nothing (NaN): let it see every key and
    # zero its output afterwards, which also keeps its gradient exactly zero.
    seen = allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed | ~seen, scale=scale, dropout_p=dropout_p
    )
    return out.masked_fill(~seen, 0.0)


def softmax_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Slow, explicit softmax attention: the full ``(Lq, Lk)`` weight matrix, then ``@ v``.

    Padded keys and values are zeroed, then their weights set to 0 (see
    :func:`softmax_attention`).
    """
    if key_padding_mask is not None:
        k, v = _zero_padded(k, v, key_padding_mask)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * scale  # (B, H, Lq, Lk)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is None:
        return torch.softmax(logits, dim=-1) @ v
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = torch.where(allowed.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ v


def _zero_padded(k: Tensor, v: Tensor, key_padding_mask: Tensor) -> tuple[Tensor, Tensor]:
    """k ``(B, H, Lk, D)`` and v ``(B, H, Lk, Dv)`` with the padded positions set to 0: a
    masked logit becomes −∞ by addition (NaN + −∞ is NaN) and a zero weight times a NaN value
    is NaN, so masking the weights alone would let such entries through."""
    pad = key_padding_mask[:, None, :, None]  # (B, 1, Lk, 1)
    return k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
