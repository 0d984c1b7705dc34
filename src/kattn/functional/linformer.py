"""Linformer (Wang et al. 2020 §4): softmax attention over keys and values projected along the
sequence.

``softmax(Q (E K)ᵀ/√D) (F V)`` with ``E, F ∈ R^{k×Lk}``: the Lk keys and values are mixed into
k rows each, so attention costs O(Lq·k·(D + Dv)) plus O(Lk·k·(D + Dv)) for the projections.
Padded keys and values are zeroed before projecting, so they contribute nothing (not even a
NaN or an infinity stored there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .numerics import zero_padded
from .softmax import softmax_attention, softmax_attention_reference

__all__ = ["linformer_attention", "linformer_attention_reference"]


def linformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """Linformer attention ``softmax(Q (E K)ᵀ/√D) (F V)``, in O(L·k·(D + Dv)).

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        e, f: ``(H or 1, k, Lk)`` projections of the keys and of the values (one for every
            head when the first dim is 1; the same tensor twice when they are shared). They
            are cast to the dtype of q.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.

    Returns:
        ``(B, H, Lq, Dv)``.
    """
    k, v = _projected_inputs(q, k, v, e, f, key_padding_mask)
    k_proj = e.to(q.dtype) @ k  # (B, H, k, D)
    v_proj = f.to(q.dtype) @ v  # (B, H, k, Dv)
    return softmax_attention(q, k_proj, v_proj)


def linformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    f: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """:func:`linformer_attention` with E and F as explicit ``(k, Lk)`` matrices per head and
    the full ``(Lq, k)`` weight matrix (slow; for tests). Arguments as there."""
    k, v = _projected_inputs(q, k, v, e, f, key_padding_mask)
    h = q.shape[1]
    e_h, f_h = (x.to(q.dtype).expand(h, -1, -1) for x in (e, f))  # (H, k, Lk) each
    k_proj = torch.einsum("hpl,bhld->bhpd", e_h, k)
    v_proj = torch.einsum("hpl,bhld->bhpd", f_h, v)
    return softmax_attention_reference(q, k_proj, v_proj)


def _projected_inputs(
    q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """k and v with padded positions zeroed, after checking that E and F fit them."""
    h, lk = q.shape[1], k.shape[2]
    for name, x in (("e", e), ("f", f)):
        if x.dim() != 3 or x.shape[0] not in (1, h) or x.shape[2] != lk:
            raise ValueError(
                f"{name} must be (H or 1, k, Lk) = ({h} or 1, k, {lk}), got {tuple(x.shape)}"
            )
    if e.shape[1] != f.shape[1]:
        raise ValueError(
            f"e and f must project to the same k rows, got {e.shape[1]} and {f.shape[1]}"
        )
    k, v = zero_padded(key_padding_mask, k, v)
    return k, v
