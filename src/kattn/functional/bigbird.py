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

:func:`bigbird_layout` draws the pattern and the plan of the keys each query block gathers
(:class:`BigBirdLayout`); :func:`bigbird_attention` computes attention over it in
O(L·(W + R)·b·D + G·L·D) time and O(L·(W + R + G/b)·b) memory; :func:`bigbird_pattern`
writes the pattern densely for the reference. The key blocks are gathered as in
:func:`~kattn.functional.sparse.block_sparse_attention`, but each query block's masked
softmax is one fused ``scaled_dot_product_attention`` call: the core's masked softmax makes
about eight passes over the ``(L, K·b)`` scores, which kept this pattern under 2× the speed
of dense SDPA at L = 16K on a CPU, against about 6× fused.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim, b block size,
nB = ⌈L/b⌉ blocks, W window blocks, R random blocks, K = W + R + ⌈G/b⌉, G global tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import int_at_least, positive_int
from .numerics import accumulation_dtype, autocast_off
from .sparse import block_pattern_to_dense, sparse_attention_reference
from .sparse_combine import add_global_tokens

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
        gather_index: ``(H, nB, K)`` int64, the blocks each query block gathers: its window
            and random blocks (0 for unused slots), then the ⌈G/b⌉ blocks of global tokens,
            numbered from nB on (they follow the sequence's blocks).
        key_positions: ``(H, nB, K·b)`` int64, the position of each gathered key (clamped
            into ``[0, L)`` where the slot is unused).
        key_allowed: ``(H, nB, K·b)`` bool, whether a gathered key counts: a used slot, a
            real position, and a global token only in the global blocks (so it counts once).
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
    gather_index: Tensor
    key_positions: Tensor
    key_allowed: Tensor


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
    return _with_plan(window, index, valid, glob, length, bs, device, causal=causal, full=full)


def _with_plan(
    window: Tensor,
    random: Tensor,
    random_valid: Tensor,
    glob: Tensor | None,
    length: int,
    bs: int,
    device: torch.device | str | None,
    *,
    causal: bool,
    full: bool,
) -> BigBirdLayout:
    """The layout of these blocks with its gather plan (:class:`BigBirdLayout`)."""
    heads, n_blocks = random.shape[0], window.shape[0]
    window_valid = (window >= 0) & (window < n_blocks)
    index = torch.cat([window.expand(heads, *window.shape), random], dim=-1)
    valid = torch.cat([window_valid.expand(heads, *window.shape), random_valid], dim=-1)
    pos = index[..., None] * bs + torch.arange(bs)  # (H, nB, K, b)
    ok = valid[..., None] & (pos >= 0) & (pos < length)
    index = torch.where(valid, index, 0)
    if glob is not None:  # a global token counts through the global blocks only
        is_global = torch.zeros(length, dtype=torch.bool)
        is_global[glob] = True
        ok = ok & ~is_global[pos.clamp(0, length - 1)]
        n_gb = -(-glob.numel() // bs)
        slot = torch.arange(n_gb * bs).view(n_gb, bs)
        g_pos = glob[slot.clamp(max=glob.numel() - 1)].expand(heads, n_blocks, n_gb, bs)
        g_ok = (slot < glob.numel()).expand_as(g_pos)
        pos, ok = torch.cat([pos, g_pos], dim=2), torch.cat([ok, g_ok], dim=2)
        extra = torch.arange(n_blocks, n_blocks + n_gb).expand(heads, n_blocks, n_gb)
        index = torch.cat([index, extra], dim=-1)
    return BigBirdLayout(
        window.to(device),
        window_valid.to(device),
        random.to(device),
        random_valid.to(device),
        None if glob is None else glob.to(device),
        length,
        bs,
        causal,
        full,
        index.to(device),
        pos.flatten(2).clamp(0, length - 1).to(device),
        ok.flatten(2).to(device),
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
    O(L·(W + R + G/b)·b) memory (times b when causal, for the per-token mask).

    Each query block's keys and values (window, random, then the global tokens gathered
    into extra blocks; a global token inside a block counts through the global blocks only)
    are gathered into ``(B, H·nB, K·b, ·)`` and read by one fused softmax; the global query
    rows read every key in a second, ``(G, L)`` call. Half precision is computed in fp32.

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
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pad = key_padding_mask
    glob = layout.global_positions
    glob = None if glob is None else glob.to(q.device)
    acc = accumulation_dtype(q.dtype)
    with autocast_off(q):
        q_, k_, v_ = q.to(acc), k.to(acc), v.to(acc)
        if pad is not None:  # zeroed: not even a NaN stored there gets through
            k_ = k_.masked_fill(pad[:, None, :, None], 0.0)
            v_ = v_.masked_fill(pad[:, None, :, None], 0.0)
        out = _block_rows(q_, k_, v_, layout, glob, pad, scale)
        if glob is not None:  # global query g reads every key (j ≤ g when causal)
            j = torch.arange(layout.length, device=q.device)
            seen = (j <= glob[:, None]) if layout.causal else None  # (G, L)
            if pad is not None:
                seen = ~pad[:, None, None, :] if seen is None else seen & ~pad[:, None, None, :]
            rows = _fused_softmax(q_.index_select(2, glob), k_, v_, seen, scale, pad is not None)
            out = out.index_copy(2, glob, rows)
    return out.to(q.dtype)


def bigbird_pattern(layout: BigBirdLayout) -> Tensor:
    """The dense pattern ``allowed (H, L, L)`` (bool) of ``layout`` from its window and random
    blocks and global tokens alone (not the gather plan): what :func:`bigbird_attention`
    computes, for the dense reference and plots. O(H·L²) memory."""
    shape = (layout.random_index.shape[0], *layout.window_index.shape)
    index = torch.cat([layout.window_index.expand(shape), layout.random_index], dim=-1)
    valid = torch.cat([layout.window_valid.expand(shape), layout.random_valid], dim=-1)
    mask = (lambda i, j: j <= i) if layout.causal else None
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


def _block_rows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: BigBirdLayout,
    glob: Tensor | None,
    pad: Tensor | None,
    scale: float,
) -> Tensor:
    """Every query over its window, random and global keys, ``(B, H, L, Dv)``: the layout's
    blocks gathered per query block into ``(B, H·nB, K·b, ·)``, one fused softmax over them."""
    b, h, length, d = q.shape
    bs, n_blocks = layout.block_size, layout.window_index.shape[0]
    index = layout.gather_index.to(q.device)
    pos = layout.key_positions.to(q.device)
    allowed = layout.key_allowed.to(q.device)  # (H, nB, K·b)
    if pad is not None:
        allowed = allowed & ~pad[:, pos]  # (B, H, nB, K·b)
    allowed = allowed.reshape(-1, h * n_blocks, 1, pos.shape[-1])
    if layout.causal:  # (1, H·nB, b, K·b): key j ≤ query i
        query_pos = torch.arange(n_blocks * bs, device=q.device).view(n_blocks, bs, 1)
        allowed = allowed & (pos[:, :, None, :] <= query_pos).flatten(0, 1)
    n_all = n_blocks + (0 if glob is None else -(-glob.numel() // bs))
    flat = (torch.arange(b * h, device=q.device).view(b, h, 1, 1) * n_all + index).reshape(-1)
    shape = (b, h * n_blocks, pos.shape[-1], -1)
    kg = _blocks(k, glob, n_all, bs).index_select(0, flat).view(shape)
    vg = _blocks(v, glob, n_all, bs).index_select(0, flat).view(shape)
    qb = F.pad(q, (0, 0, 0, n_blocks * bs - length)).view(b, h * n_blocks, bs, d)
    out = _fused_softmax(qb, kg, vg, allowed, scale, pad is not None)
    return out.view(b, h, n_blocks * bs, -1)[:, :, :length]


def _blocks(x: Tensor, glob: Tensor | None, n_all: int, bs: int) -> Tensor:
    """``(B·H·n_all, b, ·)``: the sequence's blocks (the last one zero-padded), then the
    global tokens' blocks."""
    b, h, length, dim = x.shape
    ext = x.new_zeros(b, h, n_all * bs, dim)
    ext[:, :, :length] = x
    if glob is not None:
        start = -(-length // bs) * bs
        ext[:, :, start : start + glob.numel()] = x.index_select(2, glob)
    return ext.view(b * h * n_all, bs, dim)


def _fused_softmax(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float, guard: bool
) -> Tensor:
    """``softmax(q kᵀ · scale, masked to allowed) v`` by ``scaled_dot_product_attention``.
    With ``guard`` (padding may leave a row nothing to read), such a row reads key 0 instead
    and its output is zeroed, so that neither the output nor the gradients see a 0/0."""
    if not guard or allowed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    empty = ~allowed.any(dim=-1, keepdim=True)
    first = torch.arange(allowed.shape[-1], device=allowed.device) == 0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | (empty & first), scale=scale)
    return out.masked_fill(empty, 0.0)


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
