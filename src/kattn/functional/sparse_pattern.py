"""Block tables and per-token masks: how a pattern is given to the block-sparse core
(:func:`~kattn.functional.sparse.block_sparse_attention`), how it is checked, and the dense
``(Lq, Lk)`` pattern it stands for (:func:`block_pattern_to_dense`).

A pattern is a table of the key blocks each query block reads, ``block_index`` broadcastable to
``(B, H, nQ, K)``, an optional ``block_valid`` of the same shape (False: a padding slot), and an
optional per-token mask inside the gathered blocks, a bool tensor broadcastable to
``(B, H, nQ, block, K·block)`` or a callable of the absolute positions (:data:`TokenMaskFn`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..checks import positive_int

__all__ = ["TokenMaskFn", "block_pattern_to_dense"]

#: ``token_mask(query_pos, key_pos) -> bool``: absolute positions, query_pos ``(nQ, block, 1)``
#: and key_pos ``(B or 1, H or 1, nQ, 1, K·block)``; True = allowed.
TokenMaskFn = Callable[[Tensor, Tensor], Tensor]


def block_pattern_to_dense(
    block_index: Tensor,
    block_valid: Tensor | None,
    token_mask: Tensor | TokenMaskFn | None,
    lq: int,
    lk: int,
    block_size: int,
) -> Tensor:
    """The dense pattern ``allowed (…, Lq, Lk)`` (bool) that :func:`block_sparse_attention`
    computes for these arguments, in O(Lq·Lk) memory: for tests and pattern checks only.

    Arguments as in :func:`block_sparse_attention` (key padding is not part of the pattern:
    pass it to :func:`sparse_attention_reference` as ``key_padding_mask``). The leading dims
    are those of the block table and masks, broadcast to rank 4 (1 where they do not vary).
    """
    bs = positive_int("block_size", block_size)
    lq, lk = positive_int("lq", lq), positive_int("lk", lk)
    n_q, n_k = -(-lq // bs), -(-lk // bs)
    idx, valid = checked_block_table(block_index, block_valid, None, None, n_q, n_k)
    mask_t = token_mask_as_tensor(token_mask, None, None, n_q, bs, idx.shape[-1])
    allowed = chunk_allowed(idx, valid, token_mask, mask_t, 0, n_q, bs, lk)
    bi, hi, _, _, kb = allowed.shape
    kmax = kb // bs
    allowed = allowed.expand(bi, hi, n_q, bs, kb).reshape(bi, hi, n_q, bs, kmax, bs)
    index = idx.expand(bi, hi, n_q, kmax)[:, :, :, None, :, None].expand_as(allowed)
    dense = torch.zeros(bi, hi, n_q, bs, n_k, bs, dtype=torch.int32, device=idx.device)
    dense.scatter_add_(4, index, allowed.to(torch.int32))
    return (dense > 0).view(bi, hi, n_q * bs, n_k * bs)[:, :, :lq, :lk]


def checked_block_table(
    block_index: Tensor,
    block_valid: Tensor | None,
    b: int | None,
    h: int | None,
    n_q: int,
    n_k: int,
) -> tuple[Tensor, Tensor]:
    """The block table as rank-4 int64 indices (ignored slots set to 0) and the bool mask of
    the slots that count (valid and not a repeat of an earlier valid slot of the row)."""
    if block_index.dtype in (torch.bool,) or block_index.is_floating_point():
        raise ValueError(f"block_index must be an integer tensor, got dtype {block_index.dtype}")
    if not 2 <= block_index.ndim <= 4:
        raise ValueError(
            "block_index must have rank 2 to 4, broadcastable to (B, H, nQ, K), got shape "
            f"{tuple(block_index.shape)}"
        )
    idx = block_index.long().view((1,) * (4 - block_index.ndim) + tuple(block_index.shape))
    target = (b or idx.shape[0], h or idx.shape[1], n_q, idx.shape[3])
    valid = torch.ones((), dtype=torch.bool, device=idx.device)
    if block_valid is not None:
        if block_valid.dtype != torch.bool:
            raise ValueError(f"block_valid must be a bool tensor, got dtype {block_valid.dtype}")
        valid = block_valid
    try:  # broadcast only as far as the table varies: B and H stay 1 when it does not
        shape = torch.broadcast_shapes(idx.shape, valid.shape)
        fits = torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        shape, fits = None, False
    if shape is None or not fits or shape[2] != n_q or shape[3] != idx.shape[3] or len(shape) != 4:
        raise ValueError(
            f"block_index (shape {tuple(block_index.shape)}) and block_valid must be "
            f"broadcastable to (B, H, nQ, K) = {target}"
        )
    idx, valid = idx.expand(shape), valid.expand(shape)
    bad = valid & ((idx < 0) | (idx >= n_k))
    if bool(bad.any()):
        raise ValueError(
            f"block_index must lie in [0, nK) = [0, {n_k}) on valid slots, got values from "
            f"{int(idx[bad].min())} to {int(idx[bad].max())}"
        )
    idx = torch.where(valid, idx, 0)
    kmax = idx.shape[3]
    earlier = torch.ones(kmax, kmax, dtype=torch.bool, device=idx.device).tril(-1)
    repeat = ((idx[..., :, None] == idx[..., None, :]) & earlier & valid[..., None, :]).any(-1)
    return idx, valid & ~repeat


def token_mask_as_tensor(
    token_mask: Tensor | TokenMaskFn | None,
    b: int | None,
    h: int | None,
    n_q: int,
    bs: int,
    kmax: int,
) -> Tensor | None:
    """A token mask given as a tensor, checked and made rank 5; None for a callable or None."""
    if not isinstance(token_mask, Tensor):
        return None
    target = (b or 1, h or 1, n_q, bs, kmax * bs)
    if token_mask.dtype != torch.bool or token_mask.ndim > 5:
        raise ValueError(
            f"token_mask must be a callable or a bool tensor broadcastable to "
            f"(B, H, nQ, block, K·block) = {target}, got dtype {token_mask.dtype} and shape "
            f"{tuple(token_mask.shape)}"
        )
    mask = token_mask.view((1,) * (5 - token_mask.ndim) + tuple(token_mask.shape))
    try:
        ok = torch.broadcast_shapes(mask.shape, target)[2:] == target[2:]
        ok = (
            ok and (b is None or mask.shape[0] in (1, b)) and (h is None or mask.shape[1] in (1, h))
        )
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"token_mask must be broadcastable to (B, H, nQ, block, K·block) = {target}, "
            f"got shape {tuple(token_mask.shape)}"
        )
    return mask


def chunk_allowed(
    idx: Tensor,
    valid: Tensor,
    token_mask: Tensor | TokenMaskFn | None,
    mask_t: Tensor | None,
    c0: int,
    c1: int,
    bs: int,
    lk: int,
) -> Tensor:
    """Bool ``(B or 1, H or 1, c1 − c0, block or 1, K·block)``: which gathered keys the query
    blocks c0..c1 may read (valid, non-repeated slot; a real key position; the token mask)."""
    ic = idx[:, :, c0:c1]
    vc = valid[:, :, c0:c1]
    offsets = torch.arange(bs, device=idx.device)
    key_pos = (ic[..., None] * bs + offsets).flatten(-2)[:, :, :, None, :]
    allowed = (vc[..., None].expand(*vc.shape, bs).flatten(-2)[:, :, :, None, :]) & (key_pos < lk)
    if mask_t is not None:
        allowed = allowed & (mask_t[:, :, c0:c1] if mask_t.shape[2] > 1 else mask_t)
    elif token_mask is not None:
        query_pos = (torch.arange(c0, c1, device=idx.device)[:, None] * bs + offsets)[..., None]
        fn_mask = token_mask(query_pos, key_pos)  # type: ignore[operator]
        allowed = allowed & fn_mask
    return allowed
