"""BigBird block-sparse attention (Zaheer et al., Big Bird: Transformers for Longer Sequences,
NeurIPS 2020, §2 and App. D, the BigBird-ITC form): window, random and global keys.

With the sequence cut into blocks of b tokens (the last one partial when b does not divide
L), query i in block ``n = ⌊i/b⌋`` reads the window blocks ``n − w … n + w``
(``num_window_blocks = 2w + 1``), ``r`` random blocks drawn per head and query block without
replacement among the blocks it does not already read (outside its window, holding no global
token), and the global tokens, which every query reads and which read every key. The global
tokens are the first ⌈G/2⌉ and the last ⌊G/2⌋ positions: G = 2b is the released code's ITC
layout, where the first and the last block are global. A sequence with no more blocks than
the pattern reads (``⌈L/b⌉ ≤ 2w + 1 + r + the blocks holding global tokens``) gets full
attention (the released code and HuggingFace's ``BigBirdModel`` also fall back to full
attention on short sequences).

Causal form (kattn's; the paper's BigBird is an encoder pattern): window blocks ``n − w … n``
with ``j ≤ i`` inside block n, random blocks drawn among the blocks before the window (fewer
when there are fewer), a global key g read by the queries ``i ≥ g`` and a global query g
reading the keys ``j ≤ g``.

:func:`bigbird_layout` draws the pattern (:class:`BigBirdLayout`); :func:`bigbird_attention`
computes attention over it as a pattern on the block-sparse core,
:func:`~kattn.functional.sparse_combine.block_sparse_attention_with_globals`: the window and
random blocks are the block table, the global tokens its global keys and queries, in
O(L·(W + R)·b·D + G·L·D) time and O(L·(W + R + G/b)·b) memory; :func:`bigbird_pattern`
writes the pattern densely for the reference.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim, b block size,
nB = ⌈L/b⌉ blocks, W window blocks, R random blocks, K = W + R, G global tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int
from .sparse import sparse_attention_reference
from .sparse_combine import add_global_tokens, block_sparse_attention_with_globals
from .sparse_pattern import TokenMaskFn, block_pattern_to_dense

__all__ = [
    "BigBirdLayout",
    "bigbird_attention",
    "bigbird_global_positions",
    "bigbird_layout",
    "bigbird_pattern",
]


class BigBirdLayout(NamedTuple):
    """One draw of the BigBird pattern for a self-attention of ``length`` tokens.

    Attributes:
        window_index: ``(nB, W)`` int64, the window blocks of each query block (all the
            blocks when ``full``); slots outside ``[0, nB)`` are not valid.
        window_valid: ``(nB, W)`` bool, the slots of window_index that count.
        random_index: ``(H, nB, R)`` int64, the random blocks per head and query block.
        random_valid: ``(H, nB, R)`` bool, the slots of random_index that count (fewer than R
            when fewer blocks are eligible, as for early blocks in the causal form).
        global_positions: 1-D int64 positions of the global tokens, or None.
        length: L.
        block_size: b.
        causal: whether this is the causal form.
        full: whether the pattern degenerated to full (or full causal) attention.
    """

    window_index: Tensor
    window_valid: Tensor
    random_index: Tensor
    random_valid: Tensor
    global_positions: Tensor | None
    length: int
    block_size: int
    causal: bool
    full: bool


def bigbird_global_positions(length: int, num_global: int) -> Tensor | None:
    """The global tokens of a sequence of ``length``: the first ⌈G/2⌉ and the last ⌊G/2⌋
    positions (all of them when G ≥ L), G = ``num_global``, sorted; None when G = 0."""
    length = positive_int("length", length)
    g = int_at_least("num_global", num_global, 0)
    if g == 0:
        return None
    front, back = min(length, -(-g // 2)), min(length, g // 2)
    positions = torch.cat([torch.arange(front), torch.arange(length - back, length)])
    return torch.unique(positions)


def bigbird_layout(
    length: int,
    *,
    block_size: int,
    num_window_blocks: int,
    num_random_blocks: int,
    num_global: int,
    num_heads: int,
    causal: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> BigBirdLayout:
    """Draw the BigBird pattern of a sequence of ``length`` (module docstring): the window
    blocks, ``num_random_blocks`` random blocks per head and query block (uniform, without
    replacement, among the eligible ones, by Floyd's algorithm: O(H·nB·R) work, no
    ``(nB, nB)`` tensor), and the global tokens.

    Args:
        length: L; block_size: b; num_heads: H (each head draws its own random blocks).
        num_window_blocks: 2w + 1, odd; num_random_blocks: r >= 0; num_global: G >= 0
            (:func:`bigbird_global_positions`).
        causal: the causal form (module docstring).
        generator: the (CPU) ``torch.Generator`` of the random blocks; None: the global RNG.
        device: where the layout's tensors go.
    """
    length = positive_int("length", length)
    bs = positive_int("block_size", block_size)
    w = window_half_width(num_window_blocks)
    r = int_at_least("num_random_blocks", num_random_blocks, 0)
    positive_int("num_heads", num_heads)
    n_blocks = -(-length // bs)
    glob = bigbird_global_positions(length, num_global)
    front, back = -(-num_global // 2), num_global // 2  # blocks [first, end): no global token
    first = -(-min(front, length) // bs)
    end = max(first, (length - back) // bs if back > 0 else n_blocks)
    full = n_blocks <= num_window_blocks + r + n_blocks - (end - first)
    n = torch.arange(n_blocks)
    if full:  # every block: full (or full causal) attention
        window = n.expand(n_blocks, n_blocks)
        index = torch.zeros(num_heads, n_blocks, 0, dtype=torch.long)
        valid, glob = index.bool(), None
    else:
        window = n[:, None] + torch.arange(-w, 1 if causal else w + 1)
        if causal:  # eligible: [first, n − w), before the window
            stop = (n - w).clamp(first, end)
            cut_lo = cut_hi = stop
        else:  # eligible: [first, end) less the window [n − w, n + w]
            stop = torch.full_like(n, end)
            cut_lo, cut_hi = (n - w).clamp(first, end), (n + w + 1).clamp(first, end)
        index, valid = _random_blocks(first, cut_lo, cut_hi, stop, r, num_heads, generator)
    return BigBirdLayout(
        window.to(device),
        ((window >= 0) & (window < n_blocks)).to(device),
        index.to(device),
        valid.to(device),
        None if glob is None else glob.to(device),
        length,
        bs,
        causal,
        full,
    )


def bigbird_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: BigBirdLayout,
    *,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Softmax attention over the BigBird pattern ``layout`` (window, random and global keys;
    module docstring), in O(L·(W + R)·b·(D + Dv) + G·L·(D + Dv)) time and
    O(L·(W + R + G/b)·b) memory.

    A pattern on the block-sparse core
    (:func:`~kattn.functional.sparse_combine.block_sparse_attention_with_globals`): the block
    table holds each query block's window blocks, then its random blocks (``(H, nB, W + R)``,
    slots outside the sequence or not drawn marked not valid), and the global tokens are its
    global keys and queries (a global token inside a window block counts once). Causal: one
    ``(b, (W + R)·b)`` token mask serves every query block, since the window blocks
    ``n − w … n`` come first in every row (``j ≤ i`` inside the last, block n) and the random
    blocks lie before the window. Half precision is computed in fp32.

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)``, L = ``layout.length``.
        layout: from :func:`bigbird_layout` with H heads.
        key_padding_mask: ``(B, L)`` bool, True marks padding (zeroed, counted nowhere).
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q; a query that sees only padding gets zeros.
    """
    _check_layout(q, k, v, layout, key_padding_mask)
    if q.shape[0] == 0:  # an empty batch: nothing to gather, the (empty) dense form
        ones = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=q.device)
        return sparse_attention_reference(
            q, k, v, ones, key_padding_mask=key_padding_mask, scale=scale
        )
    index, valid = _block_table(layout)
    glob = layout.global_positions
    return block_sparse_attention_with_globals(
        q,
        k,
        v,
        index.to(q.device),
        block_size=layout.block_size,
        block_valid=valid.to(q.device),
        token_mask=_token_mask(layout, q.device),
        global_keys=glob,
        global_queries=glob,
        causal=layout.causal,
        key_padding_mask=key_padding_mask,
        scale=scale,
    )


def bigbird_pattern(layout: BigBirdLayout) -> Tensor:
    """The dense pattern ``allowed (H, L, L)`` (bool) of ``layout`` from its window and random
    blocks and global tokens, with the causal cut written per token (``j ≤ i``), not as
    :func:`bigbird_attention`'s shared token mask: what it computes, for the dense reference
    and plots. O(H·L²) memory."""
    index, valid = _block_table(layout)
    mask = _causal if layout.causal else None
    length = layout.length
    dense = block_pattern_to_dense(index, valid, mask, length, length, layout.block_size)[0]
    glob = layout.global_positions
    return add_global_tokens(dense, global_keys=glob, global_queries=glob, causal=layout.causal)


def window_half_width(num_window_blocks: int) -> int:
    """w for ``num_window_blocks = 2w + 1``; ValueError unless it is an odd positive int."""
    nw = positive_int("num_window_blocks", num_window_blocks)
    if nw % 2 == 0:
        raise ValueError(
            "num_window_blocks must be odd (2w + 1 blocks centred on the query's block), "
            f"got {num_window_blocks!r}"
        )
    return nw // 2


def _random_blocks(
    first: int,
    cut_lo: Tensor,
    cut_hi: Tensor,
    stop: Tensor,
    r: int,
    num_heads: int,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Per head, for each query block n, ``min(r, m_n)`` distinct blocks drawn uniformly from
    ``[first, cut_lo_n) ∪ [cut_hi_n, stop_n)`` (m_n blocks), by Floyd's algorithm: step s
    draws t uniform in ``[0, m − r + s]`` and keeps t, or ``m − r + s`` if t was kept
    before. Returns the ``(H, nB, r)`` blocks (0 where not valid) and their validity."""
    n_blocks = cut_lo.numel()
    left = cut_lo - first  # eligible blocks before the cut
    m = left + (stop - cut_hi)
    u = torch.rand(num_heads, n_blocks, r, generator=generator, dtype=torch.float64)
    ranks = torch.zeros(num_heads, n_blocks, r, dtype=torch.long)
    valid = torch.zeros(num_heads, n_blocks, r, dtype=torch.bool)
    for s in range(r):
        top = m - r + s  # (nB,): the step draws from [0, top]
        t = (u[..., s] * (top + 1).clamp(min=1)).long().clamp(max=top.clamp(min=0))
        taken = ((ranks[..., :s] == t[..., None]) & valid[..., :s]).any(-1)
        ranks[..., s] = torch.where(taken, top, t)
        valid[..., s] = top >= 0
    left, cut_hi = left[:, None], cut_hi[:, None]  # (nB, 1) against ranks (H, nB, r)
    blocks = torch.where(ranks < left, first + ranks, cut_hi + ranks - left)
    return torch.where(valid, blocks, 0), valid


def _block_table(layout: BigBirdLayout) -> tuple[Tensor, Tensor]:
    """The block table ``(H, nB, W + R)`` of the layout and its valid slots: each query
    block's window blocks, then its random blocks."""
    shape = (layout.random_index.shape[0], *layout.window_index.shape)
    index = torch.cat([layout.window_index.expand(shape), layout.random_index], dim=-1)
    valid = torch.cat([layout.window_valid.expand(shape), layout.random_valid], dim=-1)
    return index, valid


def _causal(query_pos: Tensor, key_pos: Tensor) -> Tensor:
    """The causal cut ``j ≤ i`` of absolute positions."""
    return key_pos <= query_pos


def _token_mask(layout: BigBirdLayout, device: torch.device) -> Tensor | TokenMaskFn | None:
    """None (non-causal); ``j ≤ i`` for full causal attention; otherwise one bool
    ``(b, (W + R)·b)`` mask for every query block: window slot w is the query's own block
    (key offset ≤ query offset), the earlier window slots and the random slots all precede it.
    """
    if not layout.causal:
        return None
    if layout.full:
        return _causal
    bs, w = layout.block_size, layout.window_index.shape[1] - 1
    slots = w + 1 + layout.random_index.shape[2]
    offset = torch.arange(bs, device=device)
    own = offset[None, :] <= offset[:, None]  # (b, b): key offset ≤ query offset
    mask = torch.ones(bs, slots, bs, dtype=torch.bool, device=device)
    mask[:, w] = own
    return mask.view(bs, slots * bs)


def _check_layout(
    q: Tensor, k: Tensor, v: Tensor, layout: BigBirdLayout, key_padding_mask: Tensor | None
) -> None:
    """ValueError unless q, k, v are self-attention inputs of the layout's length and heads
    and the padding mask is a ``(B, L)`` bool tensor."""
    heads, length = layout.random_index.shape[0], layout.length
    if not (
        q.ndim == k.ndim == v.ndim == 4
        and q.shape[1:3] == (heads, length)
        and k.shape == q.shape
        and v.shape[:3] == q.shape[:3]
    ):
        raise ValueError(
            f"q and k must be (B, H, L, D) and v (B, H, L, Dv) with H = {heads}, L = {length} "
            f"for this layout (its blocks pair aligned positions: Lq == Lk), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    pad = key_padding_mask
    if pad is not None and (pad.dtype != torch.bool or tuple(pad.shape) != (q.shape[0], length)):
        raise ValueError(
            f"key_padding_mask must be a (B, L) = {(q.shape[0], length)} bool tensor, got "
            f"shape {tuple(pad.shape)} and dtype {pad.dtype}"
        )
