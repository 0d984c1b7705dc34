"""Block-sparse softmax attention: the one core behind the structured-sparsity baselines.

``out_i = Σ_{j ∈ S(i)} softmax_j(q_i·k_j · scale) v_j`` where ``S(i)`` is a fixed pattern of
keys. Local/sliding windows, Longformer (Beltagy et al. 2020), BigBird (Zaheer et al. 2020)
and the Sparse Transformer (Child et al. 2019) differ only in ``S``: each builds a table of
key blocks per query block (plus a per-token mask inside them) and calls
:func:`block_sparse_attention`, in O(L·K·block·D) time and O(L·K·block) memory.
:func:`sparse_attention_reference` is the dense O(Lq·Lk) form of the same maths, and
:func:`~kattn.functional.sparse_pattern.block_pattern_to_dense` expands a block table into
the pattern it stands for, so both can be compared on one pattern (how tables and token masks
are given and checked: :mod:`kattn.functional.sparse_pattern`).

Shapes: B batch, H heads, Lq/Lk query/key lengths, D query/key dim, Dv value dim, ``block``
the block size, nQ = ⌈Lq/block⌉ query blocks, nK = ⌈Lk/block⌉ key blocks, K key blocks read
by each query block.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype, autocast_off, zero_padded
from .sparse_gather import gathered_softmax_attention
from .sparse_pattern import (
    TokenMaskFn,
    checked_block_table,
    chunk_allowed,
    token_mask_as_tensor,
)

__all__ = ["block_sparse_attention", "sparse_attention_reference"]


#: score elements computed at once (the query blocks are processed in chunks of this size).
_CHUNK_ELEMENTS = 1 << 20


def sparse_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Dense masked softmax attention ``softmax(q kᵀ · scale, masked to allowed) v``, in
    O(Lq·Lk·(D + Dv)) time and O(Lq·Lk) memory: the slow, obviously correct form.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        allowed: bool, broadcastable to ``(B, H, Lq, Lk)``; True = query i may read key j.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding: those keys and values count
            nowhere (they are zeroed first, so not even a NaN stored there gets through).
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of q (computed in fp32 for half inputs, fp64 for
        fp64). A query that may read no key gets zeros, with finite gradients.
    """
    _check_qkv(q, k, v, key_padding_mask)
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor, got dtype {allowed.dtype}")
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    try:
        allowed = allowed.expand(b, h, lq, lk)
    except RuntimeError:
        raise ValueError(
            f"allowed must be broadcastable to (B, H, Lq, Lk) = {(b, h, lq, lk)}, "
            f"got shape {tuple(allowed.shape)}"
        ) from None
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with autocast_off(q):
        q_, k_, v_ = _accumulated(q, k, v, key_padding_mask)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]
        logits = torch.einsum("bhid,bhjd->bhij", q_, k_) * scale
        out = _masked_softmax(logits, allowed) @ v_
    return out.to(q.dtype)


@overload
def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_index: Tensor,
    *,
    block_size: int,
    block_valid: Tensor | None = ...,
    token_mask: Tensor | TokenMaskFn | None = ...,
    key_padding_mask: Tensor | None = ...,
    scale: float | None = ...,
    return_lse: Literal[False] = ...,
) -> Tensor: ...


@overload
def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_index: Tensor,
    *,
    block_size: int,
    block_valid: Tensor | None = ...,
    token_mask: Tensor | TokenMaskFn | None = ...,
    key_padding_mask: Tensor | None = ...,
    scale: float | None = ...,
    return_lse: Literal[True],
) -> tuple[Tensor, Tensor]: ...


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_index: Tensor,
    *,
    block_size: int,
    block_valid: Tensor | None = None,
    token_mask: Tensor | TokenMaskFn | None = None,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Softmax attention over K gathered key blocks per query block, ``out_i = Σ_{j ∈ S(i)}
    softmax_j(q_i·k_j · scale) v_j``, in O(L·K·block·(D + Dv)) time and O(L·K·block) memory.

    The queries are cut into blocks of ``block_size`` (Lq and Lk are padded internally to a
    multiple; padded positions never count). Query block n reads the keys and values of the
    key blocks ``block_index[..., n, :]``: they are gathered into ``(B, H, nQ, K·block, ·)``,
    the scores ``(B, H, nQ, block, K·block)`` go through a masked, max-subtracted softmax (in
    fp32 for half inputs), and no ``(Lq, Lk)`` tensor is ever formed (query blocks are
    processed in chunks). The backward recomputes each chunk's softmax
    (:mod:`~kattn.functional.sparse_gather`), so memory stays O(L·(D + Dv)) between forward
    and backward and O(chunk) within them. This serves local/sliding-window
    attention, Longformer (Beltagy et al. 2020), BigBird (Zaheer et al. 2020) and the Sparse
    Transformer (Child et al. 2019); :func:`~kattn.functional.sparse_pattern.block_pattern_to_dense`
    gives the dense pattern.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        block_index: integer tensor broadcastable to ``(B, H, nQ, K)`` (rank 2 to 4): the key
            blocks, in ``[0, nK)``, that each query block reads. A block repeated in a row
            counts once (later repeats are dropped), so tables may be padded with repeats.
        block_size: tokens per block, at least 1.
        block_valid: optional bool broadcastable to ``(B, H, nQ, K)``: False marks a slot
            that is not real (its index is ignored and may be anything, e.g. -1), so patterns
            with a varying number of blocks per query block can pad their table.
        token_mask: the per-token mask inside the gathered blocks, True = allowed: a bool
            tensor broadcastable to ``(B, H, nQ, block, K·block)``, or a callable
            ``token_mask(query_pos, key_pos)`` of the absolute positions, query_pos
            ``(nQ, block, 1)`` and key_pos ``(B or 1, H or 1, nQ, 1, K·block)`` (int64),
            returning such a bool tensor; e.g. ``lambda i, j: j <= i`` for causal attention,
            ``lambda i, j: (i - j).abs() <= w`` for a window not aligned with the blocks.
            A callable is called for each chunk of query blocks, again in the backward.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding (zeroed, counted nowhere).
        scale: logit scale, default ``1/√D``.
        return_lse: also return ``lse_i = log Σ_{j ∈ S(i)} exp(q_i·k_j · scale)`` (−∞ for a
            query that sees no key), so that attention over disjoint patterns can be
            combined into one softmax by
            :func:`~kattn.functional.sparse_combine.merge_partial_attention`.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of q (and with return_lse, the ``(B, H, Lq)`` lse in
        the accumulation dtype, fp32 or fp64). A query that sees no key gets zeros, with
        finite gradients.

    Raises:
        ValueError: for bad shapes or dtypes, a block_size below 1, or a (valid) block index
            outside ``[0, nK)``.
    """
    _check_qkv(q, k, v, key_padding_mask)
    bs = positive_int("block_size", block_size)
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    n_q, n_k = -(-lq // bs), -(-lk // bs)
    idx, valid = checked_block_table(block_index, block_valid, b, h, n_q, n_k)
    mask_t = token_mask_as_tensor(token_mask, b, h, n_q, bs, idx.shape[-1])
    scale = d**-0.5 if scale is None else scale
    with autocast_off(q):
        q_, k_, v_ = _accumulated(q, k, v, key_padding_mask)
        qb = _pad_length(q_ * scale, n_q * bs).reshape(b, h, n_q, bs, d)  # scaled once
        kb = _pad_length(k_, n_k * bs).reshape(b * h * n_k, bs, d)
        vb = _pad_length(v_, n_k * bs).reshape(b * h * n_k, bs, dv)
        key_ok = None
        if key_padding_mask is not None:  # (B·nK, block): True where a key is real
            key_ok = F.pad(~key_padding_mask, (0, n_k * bs - lk)).reshape(b * n_k, bs)
        kmax = idx.shape[-1]
        rows = torch.arange(b * h, device=q.device).view(b, h, 1, 1) * n_k
        batch_rows = torch.arange(b, device=q.device).view(b, 1, 1, 1) * n_k

        def chunk(c0: int, c1: int) -> tuple[Tensor, Tensor]:
            ic = idx[:, :, c0:c1].expand(b, h, c1 - c0, kmax)
            allowed = chunk_allowed(idx, valid, token_mask, mask_t, c0, c1, bs, lk)
            if key_ok is not None:
                ok = key_ok.index_select(0, (batch_rows + ic).reshape(-1))
                allowed = allowed & ok.view(b, h, c1 - c0, 1, kmax * bs)
            return (rows + ic).reshape(-1), allowed

        step = max(1, _CHUNK_ELEMENTS // (b * h * bs * kmax * bs))
        chunks = [(c0, min(n_q, c0 + step)) for c0 in range(0, n_q, step)]
        out_b, lse = gathered_softmax_attention(qb, kb, vb, chunks, chunk, kmax, return_lse)
        out = out_b.view(b, h, n_q * bs, dv)[:, :, :lq]
    if return_lse:
        return out.to(q.dtype), lse.reshape(b, h, n_q * bs)[:, :, :lq]
    return out.to(q.dtype)


def _accumulated(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v in the accumulation dtype (fp32 for half inputs), with the padded keys and
    values zeroed, so that not even a NaN stored there gets through 0 × NaN."""
    acc = accumulation_dtype(q.dtype)
    k, v = zero_padded(key_padding_mask, k.to(acc), v.to(acc))
    return q.to(acc), k, v


def _masked_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last dim of the allowed entries, max-subtracted; rows with nothing
    allowed give zero weights (and zero, finite gradients)."""
    logits = logits.masked_fill(~allowed, float("-inf"))
    top = logits.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = torch.exp(logits - top)  # exp(−∞) = 0 on disallowed entries
    den = weights.sum(dim=-1, keepdim=True)
    return weights / torch.where(den > 0, den, 1.0)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
    """ValueError unless q, k, v are ``(B, H, L, ·)`` with matching dims and the padding mask
    is a ``(B, Lk)`` bool tensor."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            "q, k and v must be (B, H, L, D) tensors, got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.shape[:2] != q.shape[:2] or v.shape[:3] != k.shape[:3] or k.shape[3] != q.shape[3]:
        raise ValueError(
            "k must be (B, H, Lk, D) and v (B, H, Lk, Dv) for q (B, H, Lq, D), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if key_padding_mask is not None and (
        key_padding_mask.dtype != torch.bool
        or tuple(key_padding_mask.shape) != (q.shape[0], k.shape[2])
    ):
        raise ValueError(
            f"key_padding_mask must be a (B, Lk) = {(q.shape[0], k.shape[2])} bool tensor, "
            f"got shape {tuple(key_padding_mask.shape)} and dtype {key_padding_mask.dtype}"
        )


def _pad_length(x: Tensor, length: int) -> Tensor:
    """``x (B, H, L, ·)`` zero-padded to ``length`` positions (x itself when L == length)."""
    return x if x.shape[2] == length else F.pad(x, (0, 0, 0, length - x.shape[2]))
