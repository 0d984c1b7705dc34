"""Synthesizer attention (Tay, Bahri, Metzler, Juan, Zhao, Zheng, "Synthesizer: Rethinking
Self-Attention for Transformer Models", ICML 2021): the attention logits are synthesised,
per token from the token alone (Dense) or as a learned matrix (Random), instead of from
query–key dot products; ``Y = softmax(S) V``. O(Lq·Lk·Dv) time, O(Lq·Lk) memory.

The synthetic logits S (``(B or 1, H, Lq, Lk)``) come from the functions below; the attention
then takes them as given: :func:`synthesizer_attention` (one fused
``scaled_dot_product_attention`` call with S as the additive mask) and the explicit
:func:`synthesizer_attention_reference`. Both optionally mix in dot-product logits with a
per-head weight α ∈ (0, 1), the paper's mixture of synthesizers:
``softmax(α·S + (1 − α)·q kᵀ·scale) V``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .numerics import accumulation_dtype, zero_padded


class DenseWeights(NamedTuple):
    """Per-head two-layer network ``relu(x W1 + b1) W2 + b2``: W1 ``(H, D, D)``, b1
    ``(H, D)``, W2 ``(H, D, M)``, b2 ``(H, M)`` (M output logits)."""

    w1: Tensor
    b1: Tensor
    w2: Tensor
    b2: Tensor


def dense_synthesizer_logits(q: Tensor, weights: DenseWeights, lk: int) -> Tensor:
    """Dense Synthesizer: ``B_i = W2 relu(W1 x_i + b1) + b2`` per token, its first Lk
    entries. q ``(B, H, Lq, D)`` → ``(B, H, Lq, Lk)``."""
    w1, b1, w2, b2 = weights
    hidden = torch.relu(q @ w1 + b1[:, None, :])  # (B, H, Lq, D)
    return hidden @ w2[:, :, :lk] + b2[:, None, :lk]


def factorized_dense_logits(
    q: Tensor, first: DenseWeights, second: DenseWeights, lk: int
) -> Tensor:
    """Factorised Dense Synthesizer: A = F_A(x_i) ∈ R^a, B = F_B(x_i) ∈ R^b with a·b
    covering the key positions; logit j is ``A[j mod a] · B[⌊j / a⌋]`` (A tiled b times, each
    entry of B repeated a times), its first Lk entries. q ``(B, H, Lq, D)`` →
    ``(B, H, Lq, Lk)``."""
    a = dense_synthesizer_logits(q, first, first.w2.shape[-1])  # (B, H, Lq, a)
    b = dense_synthesizer_logits(q, second, second.w2.shape[-1])  # (B, H, Lq, b)
    outer = b[..., :, None] * a[..., None, :]  # (B, H, Lq, b, a): row-major j = ⌊j/a⌋·a + j mod a
    return outer.flatten(-2)[..., :lk]


def factorized_dense_logits_reference(
    q: Tensor, first: DenseWeights, second: DenseWeights, lk: int
) -> Tensor:
    """:func:`factorized_dense_logits` by the paper's tiling functions, written out."""
    a = dense_synthesizer_logits(q, first, first.w2.shape[-1])
    b = dense_synthesizer_logits(q, second, second.w2.shape[-1])
    n_a, n_b = a.shape[-1], b.shape[-1]
    tiled_a = a.repeat(1, 1, 1, n_b)  # H_A: [A, A, …, A]
    tiled_b = b.repeat_interleave(n_a, dim=-1)  # H_B: [B_0 … B_0, B_1 … B_1, …]
    return (tiled_a * tiled_b)[..., :lk]


def random_synthesizer_logits(table: Tensor, lq: int, lk: int, *, offset: int = 0) -> Tensor:
    """Random Synthesizer: the rows ``offset … offset + Lq`` and first Lk columns of a
    learned (or fixed) table ``(H, M, M)`` → ``(1, H, Lq, Lk)``."""
    return table[None, :, offset : offset + lq, :lk]


def factorized_random_logits(
    left: Tensor, right: Tensor, lq: int, lk: int, *, offset: int = 0
) -> Tensor:
    """Factorised Random Synthesizer: ``R = R1 R2ᵀ`` with R1, R2 ``(H, M, k)``, the
    rows ``offset … offset + Lq`` and first Lk columns → ``(1, H, Lq, Lk)``."""
    return (left[:, offset : offset + lq] @ right[:, :lk].transpose(-1, -2))[None]


def _visible(
    lq: int, lk: int, causal: bool, key_padding_mask: Tensor | None, device: torch.device
) -> Tensor | None:
    """Bool ``(B or 1, 1, Lq, Lk)``: key j visible to query i; None if every key is."""
    allowed = None
    if causal:
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=device).tril()[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        allowed = keep if allowed is None else keep & allowed
    return allowed


def _check_mix(q: Tensor | None, k: Tensor | None, alpha: Tensor | None) -> None:
    if (q is None) != (k is None) or (q is None) != (alpha is None):
        raise ValueError("the dot-product mixture needs q, k and alpha together (or none)")


def synthesizer_attention(
    synthetic: Tensor,
    v: Tensor,
    *,
    q: Tensor | None = None,
    k: Tensor | None = None,
    alpha: Tensor | None = None,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """``softmax(S) V``, or with q, k and α ``softmax(α·S + (1 − α)·q kᵀ·scale) V``, in one
    ``scaled_dot_product_attention`` call (S as its additive mask).

    Args:
        synthetic: S ``(B or 1, H, Lq, Lk)``.
        v: ``(B, H, Lk, Dv)``.
        q, k: ``(B, H, Lq, D)``, ``(B, H, Lk, D)``: the dot-product part of a mixture.
        alpha: α ``(H,)``, the synthetic share of the mixture.
        causal: query i sees keys j <= i.
        key_padding_mask: ``(B, Lk)`` bool, True at padding: those keys and values are zeroed
            and masked (they count nowhere).
        scale: dot-product scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in v's dtype (fp32 sums for half precision); a query that sees no
        key gets zeros.
    """
    _check_mix(q, k, alpha)
    if v.shape[0] == 0:  # the fused kernel returns an empty batch detached from its inputs
        return synthesizer_attention_reference(
            synthetic, v, q=q, k=k, alpha=alpha, causal=causal,
            key_padding_mask=key_padding_mask, scale=scale,
        )  # fmt: skip
    acc = accumulation_dtype(v.dtype)
    b, h, lk, _ = v.shape
    lq = synthetic.shape[2]
    logits = synthetic.to(acc)
    (vz,) = zero_padded(key_padding_mask, v.to(acc))
    if q is not None and k is not None and alpha is not None:
        alpha = alpha.to(acc)[:, None, None]  # (H, 1, 1)
        logits = alpha * logits
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qs = q.to(acc) * (1 - alpha)
        (kz,) = zero_padded(key_padding_mask, k.to(acc))
    else:  # a zero query makes the dot-product part vanish
        qs = torch.zeros(b, h, lq, 1, dtype=acc, device=v.device)
        kz, scale = torch.zeros(b, h, lk, 1, dtype=acc, device=v.device), 1.0
    allowed = _visible(lq, lk, causal, key_padding_mask, v.device)
    seen = None
    if allowed is not None:
        seen = allowed.any(dim=-1, keepdim=True)
        logits = logits.masked_fill(~(allowed | ~seen), float("-inf"))
    out = F.scaled_dot_product_attention(
        qs, kz, vz, attn_mask=logits.expand(b, h, lq, lk), scale=scale
    )
    if seen is not None:
        out = out.masked_fill(~seen, 0.0)
    return out.to(v.dtype)


def synthesizer_attention_reference(
    synthetic: Tensor,
    v: Tensor,
    *,
    q: Tensor | None = None,
    k: Tensor | None = None,
    alpha: Tensor | None = None,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """:func:`synthesizer_attention` written out: the ``(Lq, Lk)`` logits, the explicit masked
    softmax (exp, sum, divide) and ``@ V``. Arguments as there."""
    _check_mix(q, k, alpha)
    acc = accumulation_dtype(v.dtype)
    lq, lk = synthetic.shape[2], v.shape[2]
    (vz,) = zero_padded(key_padding_mask, v.to(acc))
    logits = synthetic.to(acc)
    if q is not None and k is not None and alpha is not None:
        (kz,) = zero_padded(key_padding_mask, k.to(acc))
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        dots = torch.einsum("bhid,bhjd->bhij", q.to(acc), kz) * scale
        a = alpha.to(acc)[None, :, None, None]
        logits = a * logits + (1 - a) * dots
    allowed = _visible(lq, lk, causal, key_padding_mask, v.device)
    if allowed is None:
        allowed = torch.ones(1, 1, lq, lk, dtype=torch.bool, device=v.device)
    shift = logits.masked_fill(~allowed, float("-inf")).amax(dim=-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, 0.0).detach()
    weights = torch.exp((logits - shift).masked_fill(~allowed, float("-inf")))
    total = weights.sum(dim=-1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp_min(1e-300), 0.0)
    return (weights @ vz).to(v.dtype)
