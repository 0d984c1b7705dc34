"""Combining patterns on the block-sparse core: global tokens, and unions of disjoint patterns.

Longformer (Beltagy et al. 2020, §3.1) adds global attention to its sliding window: a few
chosen tokens attend to the whole sequence and the whole sequence attends to them. BigBird
(Zaheer et al. 2020, §2, ITC) does the same with its global tokens, and the "fixed" pattern of
the Sparse Transformer (Child et al. 2019, §4.2) makes the last ``c`` positions of every block
keys that all later queries read. In terms of the pattern ``S(i)`` of
:func:`~kattn.functional.sparse.block_sparse_attention`:

- a global key g joins every query's pattern (only queries ``i ≥ g`` when causal);
- a global query g reads every key (only keys ``j ≤ g`` when causal).

:func:`block_sparse_attention_with_globals` computes that without an (L, L) tensor: the global
keys are gathered into extra key blocks appended after the sequence, which every query block
reads (a global key inside a query's own pattern is counted once), and the few global query
rows are computed densely over all keys, in O(G·L·D). :func:`add_global_tokens` writes the same
rule into a dense pattern for :func:`~kattn.functional.sparse.sparse_attention_reference`.

A pattern that is the union of parts with different layouts (the strided pattern of Child et
al. 2019, §4.2: a local band plus every ``stride``-th key) is computed part by part, each with
its log-sum-exp (``return_lse=True``), and :func:`merge_partial_attention` makes the parts one
softmax over the union, exactly, as long as no (query, key) pair is in two parts.

Shapes: B batch, H heads, Lq/Lk query/key lengths, D query/key dim, Dv value dim, G the number
of global keys, G' of global queries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import positive_int
from .sparse import block_sparse_attention, sparse_attention_reference
from .sparse_pattern import TokenMaskFn

__all__ = [
    "add_global_tokens",
    "block_sparse_attention_with_globals",
    "global_positions",
    "merge_partial_attention",
]


def global_positions(name: str, positions: Tensor | None, length: int) -> Tensor | None:
    """``positions`` as sorted, unique int64 indices in ``[0, length)``, or None when there
    are none; ValueError for a tensor that is not a 1-D integer index list in range."""
    if positions is None:
        return None
    if positions.ndim != 1 or positions.dtype == torch.bool or positions.is_floating_point():
        raise ValueError(
            f"{name} must be a 1-D integer tensor of positions, got dtype {positions.dtype} and "
            f"shape {tuple(positions.shape)}"
        )
    if positions.numel() == 0:
        return None
    positions = torch.unique(positions.long())  # sorted
    if int(positions[0]) < 0 or int(positions[-1]) >= length:
        raise ValueError(
            f"{name} must lie in [0, {length}), got positions from {int(positions[0])} to "
            f"{int(positions[-1])}"
        )
    return positions


def add_global_tokens(
    allowed: Tensor,
    *,
    global_keys: Tensor | None = None,
    global_queries: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    """The dense pattern ``allowed (…, Lq, Lk)`` with global tokens added: the columns of the
    global keys and the rows of the global queries become allowed (only ``j ≤ i`` when
    causal); the rest is unchanged. O(Lq·Lk): for references and tests."""
    lq, lk = allowed.shape[-2:]
    gk = global_positions("global_keys", global_keys, lk)
    gq = global_positions("global_queries", global_queries, lq)
    i = torch.arange(lq, device=allowed.device)[:, None]
    j = torch.arange(lk, device=allowed.device)[None, :]
    visible = (j <= i) if causal else torch.ones(lq, lk, dtype=torch.bool, device=allowed.device)
    extra = torch.zeros(lq, lk, dtype=torch.bool, device=allowed.device)
    if gk is not None:
        extra[:, gk.to(allowed.device)] = True
    if gq is not None:
        extra[gq.to(allowed.device), :] = True
    return allowed | (extra & visible)


def block_sparse_attention_with_globals(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_index: Tensor,
    *,
    block_size: int,
    block_valid: Tensor | None = None,
    token_mask: Tensor | TokenMaskFn | None = None,
    global_keys: Tensor | None = None,
    global_queries: Tensor | None = None,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Softmax attention over a block-sparse pattern plus global tokens, in
    O((L·(K·block + G) + G'·L)·(D + Dv)) time and O(L·(K·block + G) + G'·L) memory.

    Query i reads: every key when i is a global query (``j ≤ i`` when causal); otherwise the
    keys of its block pattern (``block_index``, ``block_valid``, ``token_mask`` exactly as in
    :func:`~kattn.functional.sparse.block_sparse_attention`, which must itself encode any
    causal cut of that pattern) together with every global key (``g ≤ i`` when causal), a key
    in both counted once. :func:`add_global_tokens` applied to
    :func:`~kattn.functional.sparse.block_pattern_to_dense` gives the same pattern densely.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        block_index, block_size, block_valid: the block pattern, as for the core.
        token_mask: the per-token mask of the block pattern, as for the core: a bool tensor
            broadcastable to ``(B, H, nQ, block, K·block)`` or a callable of the absolute
            positions (the columns of the global keys' extra blocks are added here).
        global_keys: 1-D integer positions in ``[0, Lk)`` that every query reads, or None.
        global_queries: 1-D integer positions in ``[0, Lq)`` that read every key, or None.
        causal: restricts the global reads to ``j ≤ i`` (the block pattern is as given).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding (counted nowhere, global or not).
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of q; a query that sees no real key gets zeros.
    """
    bs = positive_int("block_size", block_size)
    lq, lk = q.shape[-2], k.shape[-2]
    gk = global_positions("global_keys", global_keys, lk)
    gq = global_positions("global_queries", global_queries, lq)
    if gk is None:
        out = block_sparse_attention(
            q,
            k,
            v,
            block_index,
            block_size=bs,
            block_valid=block_valid,
            token_mask=token_mask,
            key_padding_mask=key_padding_mask,
            scale=scale,
        )
    else:
        out = _with_global_keys(
            q, k, v, block_index, bs, block_valid, token_mask, gk, causal, key_padding_mask, scale
        )
    if gq is None:
        return out
    return with_global_queries(out, q, k, v, gq, causal, key_padding_mask, scale)


def with_global_queries(
    out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    global_queries: Tensor,
    causal: bool,
    key_padding_mask: Tensor | None,
    scale: float | None,
) -> Tensor:
    """``out`` with the rows of ``global_queries`` (1-D positions) replaced by attention over
    every key (``j ≤ i`` when causal), computed densely in O(G'·Lk·(D + Dv))."""
    gq = global_queries.to(q.device)
    j = torch.arange(k.shape[2], device=q.device)[None, :]
    visible = (j <= gq[:, None]) if causal else torch.ones_like(j, dtype=torch.bool)
    rows = sparse_attention_reference(
        q.index_select(2, gq), k, v, visible, key_padding_mask=key_padding_mask, scale=scale
    )
    return out.index_copy(2, gq, rows)


def _with_global_keys(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_index: Tensor,
    bs: int,
    block_valid: Tensor | None,
    token_mask: Tensor | TokenMaskFn | None,
    gk: Tensor,
    causal: bool,
    key_padding_mask: Tensor | None,
    scale: float | None,
) -> Tensor:
    """The block pattern plus the global keys, gathered as extra key blocks after the
    sequence's own (padded) blocks, on the core.

    A global key is read through its extra block only: in the sequence's own blocks it is
    marked as padding, so no query counts it twice. The token mask of the extra blocks is
    all True (non-causal) or ``g ≤ i`` (causal), appended to the pattern's own mask."""
    b, lk = k.shape[0], k.shape[2]
    gk = gk.to(k.device)
    n_k = -(-lk // bs)
    n_g = -(-gk.numel() // bs)
    tail = n_k * bs - lk  # the padding of the last sequence block
    gpad = n_g * bs - gk.numel()  # the padding of the last global block

    def extend(x: Tensor) -> Tensor:
        body = F.pad(x, (0, 0, 0, tail))
        globals_ = F.pad(x.index_select(2, gk), (0, 0, 0, gpad))
        return torch.cat([body, globals_], dim=2)

    pad = torch.zeros(b, lk, dtype=torch.bool, device=k.device)
    if key_padding_mask is not None:
        pad = key_padding_mask
    body_pad = pad.index_fill(1, gk, True)  # global keys: read in their own blocks only
    pad_ext = torch.cat(
        [F.pad(body_pad, (0, tail), value=True), F.pad(pad[:, gk], (0, gpad), value=True)], dim=1
    )
    idx = block_index.long()
    idx = idx.view((1,) * (4 - idx.ndim) + tuple(idx.shape))
    n_q = -(-q.shape[2] // bs)
    kmax = idx.shape[-1]
    if idx.ndim != 4 or idx.shape[2] not in (1, n_q):
        raise ValueError(
            f"block_index must be broadcastable to (B, H, nQ, K) with nQ = {n_q}, got shape "
            f"{tuple(block_index.shape)}"
        )
    extra = torch.arange(n_k, n_k + n_g, device=idx.device).expand(*idx.shape[:2], n_q, n_g)
    idx_ext = torch.cat([idx.expand(*idx.shape[:2], n_q, kmax), extra], dim=-1)
    valid_ext = None
    if block_valid is not None:
        valid = block_valid.view((1,) * (4 - block_valid.ndim) + tuple(block_valid.shape))
        valid = valid.expand(*torch.broadcast_shapes(valid.shape, (*idx.shape[:2], n_q, kmax)))
        ones = torch.ones(*valid.shape[:3], n_g, dtype=torch.bool, device=valid.device)
        valid_ext = torch.cat([valid, ones], dim=-1)
    rows = torch.arange(n_q * bs, device=q.device).view(1, 1, n_q, bs, 1)
    # the extra blocks' mask: (1, 1, nQ or 1, block, nG·block)
    position = F.pad(gk, (0, gpad), value=n_q * bs)  # block padding: never read (and padded)
    global_mask = (position <= rows) if causal else torch.ones_like(position, dtype=torch.bool)
    if not causal:
        global_mask = global_mask.view(1, 1, 1, 1, -1).expand(1, 1, 1, bs, -1)
    start = n_k * bs
    mask: Tensor | TokenMaskFn
    if token_mask is None:
        token_mask = torch.ones(1, 1, 1, 1, kmax * bs, dtype=torch.bool, device=q.device)
    if isinstance(token_mask, Tensor):
        own = token_mask.view((1,) * (5 - token_mask.ndim) + tuple(token_mask.shape))
        lead = torch.broadcast_shapes(own.shape[:3], global_mask.shape[:3])
        own = own.expand(*lead, bs, kmax * bs)
        mask = torch.cat([own, global_mask.expand(*lead, bs, -1)], dim=-1)
    else:
        user = token_mask

        def mask(i: Tensor, j: Tensor) -> Tensor:
            in_globals = j >= start
            own = ~in_globals & user(i, j)
            slot = (j - start).clamp(0, n_g * bs - 1)
            if not causal:
                return own | in_globals
            return own | (in_globals & (position[slot] <= i))

    return block_sparse_attention(
        q,
        extend(k),
        extend(v),
        idx_ext,
        block_size=bs,
        block_valid=valid_ext,
        token_mask=mask,
        key_padding_mask=pad_ext,
        scale=scale,
    )


def merge_partial_attention(parts: list[tuple[Tensor, Tensor]]) -> Tensor:
    """One softmax over the union of disjoint patterns from the attention over each:
    ``out = Σ_p exp(lse_p − lse) out_p`` with ``lse = log Σ_p exp(lse_p)``.

    Args:
        parts: ``(out_p, lse_p)`` pairs, out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)``, from
            :func:`~kattn.functional.sparse.block_sparse_attention` with ``return_lse=True`` on
            patterns that share no (query, key) pair (a pair in two would count twice).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of the first out; zeros where no part sees a key.
    """
    if not parts:
        raise ValueError("merge_partial_attention needs at least one (out, lse) pair, got none")
    lse = torch.stack([p[1] for p in parts])  # (P, B, H, Lq)
    top = lse.detach().amax(dim=0)
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = torch.exp(lse - top)  # exp(−∞) = 0 for an empty part
    total = weights.sum(dim=0)
    weights = weights / torch.where(total > 0, total, 1.0)
    out = sum(w[..., None] * p[0].to(w.dtype) for w, p in zip(weights, parts, strict=True))
    return out.to(parts[0][0].dtype)
