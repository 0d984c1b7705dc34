"""Sparse Transformer attention (Child et al. 2019, "Generating Long Sequences with Sparse
Transformers", §4.2–4.3): exact softmax over factorised patterns, on the block-sparse core.

With ``l`` the stride (the block length of the fixed pattern) and ``c`` the summary width, the
causal factors of §4.2 are

* strided: ``A(1)_i = {j : i − l < j ≤ i}``, ``A(2)_i = {j ≤ i : (i − j) mod l = 0}``;
* fixed: ``A(1)_i = {j ≤ i : ⌊j/l⌋ = ⌊i/l⌋}``, ``A(2)_i = {j ≤ i : j mod l ≥ l − c}``.

The non-causal forms drop ``j ≤ i``: strided ``A(1)_i = {j : |i − j| < l}`` and ``A(2)_i =
{j : (i − j) mod l = 0}`` (symmetric in i and j), fixed ``A(1)_i`` the whole block of i and
``A(2)_i`` every summary position. They keep what §4.2 asks of a factorisation: every key is
reached from every query in two steps (strided: through the position of the key's residue in
the query's band; fixed: through a summary position of the key's block). Heads (§4.3):
``"union"`` is the merged head, ``A(1) ∪ A(2)`` in every head; ``"split"`` gives the first
⌈H/2⌉ heads A(1) and the others A(2) (one more head on the local factor when H is odd).

No ``(L, L)`` tensor is formed. Strided A(1) is a band (a block table of the key blocks each
query block overlaps, cut by a token mask). Strided A(2) is the band's transpose trick of the
paper's kernels: the sequence is permuted by ``(i mod l, ⌊i/l⌋)``, so that every residue class
is a contiguous segment of ⌈L/l⌉ positions (padded to whole blocks), attention runs inside the
segments, and the output is permuted back. The strided union merges the two parts with
:func:`~kattn.functional.sparse_combine.merge_partial_attention`, the query's own key taken out
of the A(2) part (the one pair in both). Fixed A(1) is block-diagonal and A(2) are global keys
read by every query (``g ≤ i`` when causal):
:func:`~kattn.functional.sparse_combine.block_sparse_attention_with_globals` computes both and
counts a key in both once. Time O(L·(l + L/l)·(D + Dv)) strided, O(L·(l + c·L/l)·(D + Dv))
fixed; memory O(L·(l + L/l)) and O(L·(l + c·L/l)).

Differences from released code. OpenAI's ``sparse_attention`` (blocksparse kernels) has the
same strided factors (its ``local`` band and ``strided`` mode on the transposed sequence, which
needs ``L/l`` to be a multiple of its block size; here any L). Its fixed mode works on blocks
of 32 tokens: the summaries are whole blocks, and with several heads each head reads another
sub-block of the block (§4.2 prefers distinct sub-blocks per head); here every head reads the
last c positions of each block, as in the formula. Long Range Arena's version
(``lra_benchmarks/models/sparse_transformer``) builds a dense (L, L) mask, is always causal
(encoders included), adds the first position of every block (``j mod l = 0``) to the fixed
summaries and uses block 50, c = 10 in its task runs; here the summaries are exactly the last
c positions and a non-causal form exists.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype
from .sparse import block_sparse_attention, sparse_attention_reference
from .sparse_combine import block_sparse_attention_with_globals, merge_partial_attention

__all__ = [
    "sparse_transformer_attention",
    "sparse_transformer_attention_reference",
    "sparse_transformer_pattern",
]

#: the factorised patterns of §4.2, and how the heads read their factors (§4.3).
PATTERNS = ("strided", "fixed")
HEADS = ("union", "split")

_Part = tuple[Tensor, Tensor]  # (out, lse)


class _Opts(NamedTuple):
    """The options shared by the parts: stride l, summary width c, the causal flag, the key
    padding mask, the logit scale and the largest block of the core."""

    stride: int
    c: int
    causal: bool
    pad: Tensor | None
    scale: float | None
    block: int


def sparse_transformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pattern: str = "strided",
    stride: int = 128,
    c: int = 8,
    heads: str = "union",
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    block_size: int = 64,
) -> Tensor:
    """Softmax attention over the Sparse Transformer pattern (see the module docstring), in
    O(L·(l + L/l)·(D + Dv)) time for ``"strided"`` and O(L·(l + c·L/l)·(D + Dv)) for
    ``"fixed"``, through the block-sparse core.

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)`` (the pattern is defined
            on aligned positions: Lq == Lk).
        pattern: ``"strided"`` or ``"fixed"``.
        stride: l, the stride (strided) or block length (fixed), a positive int.
        c: summary positions at the end of each block (fixed only), an int in ``[1, stride]``.
        heads: ``"union"`` (every head reads A(1) ∪ A(2)) or ``"split"`` (the first ⌈H/2⌉
            heads read A(1), the others A(2); needs H >= 2).
        causal: the causal factors (query i reads no key j > i).
        key_padding_mask: ``(B, L)`` bool, True marks padding (counted nowhere).
        scale: logit scale, default ``1/√D``.
        block_size: at most this many tokens per block of the core (speed only).

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q; a query that reads no real key gets zeros.
    """
    stride, c = _checked_options(pattern, stride, c, heads, q.shape[1] if q.ndim == 4 else 2)
    bs = positive_int("block_size", block_size)
    if q.ndim == 4 and k.ndim == 4 and q.shape[2] != k.shape[2]:
        raise ValueError(
            "the Sparse Transformer pattern needs Lq == Lk (it is defined on aligned "
            f"positions), got Lq={q.shape[2]}, Lk={k.shape[2]}"
        )
    if q.ndim == 4 and k.ndim == 4 and 0 in (*q.shape[:3], k.shape[2]):
        # nothing to gather (an empty batch): the dense form, empty and cheap here
        return sparse_transformer_attention_reference(
            q, k, v, pattern=pattern, stride=stride, c=c, heads=heads, causal=causal,
            key_padding_mask=key_padding_mask, scale=scale,
        )  # fmt: skip
    acc = accumulation_dtype(q.dtype)
    q_, k_, v_ = q.to(acc), k.to(acc), v.to(acc)  # the parts are merged in this dtype
    opts = _Opts(stride, c, causal, key_padding_mask, scale, bs)
    if heads == "union":
        return _UNION[pattern](q_, k_, v_, opts).to(q.dtype)
    h1 = -(-q.shape[1] // 2)
    first, second = _FACTORS[pattern]
    out1 = first(q_[:, :h1], k_[:, :h1], v_[:, :h1], opts)
    out2 = second(q_[:, h1:], k_[:, h1:], v_[:, h1:], opts)
    return torch.cat([out1, out2], dim=1).to(q.dtype)


def sparse_transformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pattern: str = "strided",
    stride: int = 128,
    c: int = 8,
    heads: str = "union",
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The same attention in the dense O(L²·(D + Dv)) form: :func:`sparse_transformer_pattern`
    given to :func:`~kattn.functional.sparse.sparse_attention_reference`. Arguments as in
    :func:`sparse_transformer_attention`."""
    num_heads = q.shape[1] if q.ndim == 4 else 1
    allowed = sparse_transformer_pattern(
        max(q.shape[2], 1) if q.ndim == 4 else 1, pattern=pattern, stride=stride, c=c,
        heads=heads, num_heads=num_heads, causal=causal, device=q.device,
    )  # fmt: skip
    if q.ndim == 4:
        allowed = allowed[:, : q.shape[2], : q.shape[2]]
    return sparse_attention_reference(
        q, k, v, allowed, key_padding_mask=key_padding_mask, scale=scale
    )


def sparse_transformer_pattern(
    length: int,
    *,
    pattern: str = "strided",
    stride: int = 128,
    c: int = 8,
    heads: str = "union",
    num_heads: int = 1,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense pattern ``allowed (H or 1, L, L)`` (bool) of :func:`sparse_transformer_attention`
    from position comparisons alone (no blocks, no permutation): ``[h, i, j]`` is True iff
    query i of head h reads key j. The leading dim is 1 for ``"union"`` (every head alike) and
    ``num_heads`` for ``"split"``. For the dense reference and tests; O(L²) memory."""
    length = positive_int("length", length)
    stride, c = _checked_options(pattern, stride, c, heads, positive_int("num_heads", num_heads))
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    if pattern == "strided":
        first, second = (i - j).abs() < stride, (i - j) % stride == 0
    else:
        first, second = i // stride == j // stride, (j % stride >= stride - c).expand_as(i - j)
    if causal:
        first, second = first & (j <= i), second & (j <= i)
    if heads == "union":
        return (first | second)[None]
    h1 = -(-num_heads // 2)
    return torch.cat([first.expand(h1, -1, -1), second.expand(num_heads - h1, -1, -1)])


def _checked_options(
    pattern: str, stride: int, c: int, heads: str, num_heads: int
) -> tuple[int, int]:
    """``(stride, c)`` checked, or ValueError naming the option and the value."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if heads not in HEADS:
        raise ValueError(f"heads must be one of {HEADS}, got {heads!r}")
    stride = positive_int("stride", stride)
    if positive_int("c", c) > stride and pattern == "fixed":
        raise ValueError(f"c must be at most stride={stride} (positions of a block), got {c!r}")
    if heads == "split" and num_heads < 2:
        raise ValueError(
            f"heads='split' needs at least 2 heads (one per factor), got num_heads={num_heads}"
        )
    return stride, c


def _range_table(lo: Tensor, hi: Tensor, bs: int, n_k: int) -> tuple[Tensor, Tensor]:
    """The block table ``(nQ, K)`` and its valid slots for query blocks that read the key
    positions ``[lo, hi)`` (one range per query block, clipped to ``[0, n_k·bs)``)."""
    lo, hi = lo.clamp(min=0), hi.clamp(max=n_k * bs)
    first, last = lo // bs, (hi - 1) // bs
    width = int((last - first).max()) + 1
    index = first[:, None] + torch.arange(width, device=lo.device)
    return index, (index <= last[:, None]) & (index < n_k) & (hi > lo)[:, None]


def _block_starts(length: int, bs: int, device: torch.device) -> Tensor:
    """The first position of each block of ``bs`` tokens, ``(⌈L/bs⌉,)``."""
    return torch.arange(-(-length // bs), device=device) * bs


def _band(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> _Part:
    """Strided A(1), ``i − l < j ≤ i`` (causal) or ``|i − j| < l``, and its lse."""
    stride, causal, length = opts.stride, opts.causal, q.shape[2]
    bs = min(opts.block, length)
    starts = _block_starts(length, bs, q.device)
    reach = bs if causal else bs + stride - 1  # past the block start, the last key read
    index, valid = _range_table(starts - stride + 1, starts + reach, bs, starts.numel())

    def band(i: Tensor, j: Tensor) -> Tensor:
        near = (i - j).abs() < stride
        return near & (j <= i) if causal else near

    return block_sparse_attention(
        q, k, v, index, block_size=bs, block_valid=valid, token_mask=band,
        key_padding_mask=opts.pad, scale=opts.scale, return_lse=True,
    )  # fmt: skip


def _residues(q: Tensor, k: Tensor, v: Tensor, opts: _Opts, *, with_self: bool) -> _Part:
    """Strided A(2), ``(i − j) mod l = 0`` (and ``j ≤ i`` when causal; ``j ≠ i`` unless
    ``with_self``), and its lse: attention inside the segments of the sequence permuted by
    ``(i mod l, ⌊i/l⌋)``, each residue class one segment."""
    b, length = q.shape[0], q.shape[2]
    stride = min(opts.stride, length)  # for L <= l every class is one position either way
    m = -(-length // stride)  # positions per residue class, at most
    bs = min(opts.block, m)
    seg = -(-m // bs) * bs  # a segment, padded to whole blocks
    layout = (stride, m, seg)
    pad = opts.pad
    if pad is None:
        pad = torch.zeros(b, length, dtype=torch.bool, device=q.device)
    pad = F.pad(pad, (0, stride * m - length), value=True).view(b, m, stride).transpose(1, 2)
    pad = F.pad(pad, (0, seg - m), value=True).reshape(b, stride * seg)
    per_seg = seg // bs  # key blocks per segment, all read by each of its query blocks
    first = torch.arange(stride * per_seg, device=q.device) // per_seg * per_seg
    index = first[:, None] + torch.arange(per_seg, device=q.device)
    causal = opts.causal

    def order(i: Tensor, j: Tensor) -> Tensor:  # i, j: permuted positions in one segment
        keep = j <= i if causal else torch.ones_like(j, dtype=torch.bool)
        return keep if with_self else keep & (j != i)

    out, lse = block_sparse_attention(
        _permute(q, layout), _permute(k, layout), _permute(v, layout), index, block_size=bs,
        token_mask=order if causal or not with_self else None, key_padding_mask=pad,
        scale=opts.scale, return_lse=True,
    )  # fmt: skip
    return _unpermute(out, layout, length), _unpermute(lse[..., None], layout, length)[..., 0]


def _permute(x: Tensor, layout: tuple[int, int, int]) -> Tensor:
    """``(B, H, L, ·)`` → ``(B, H, l·seg, ·)``: position ``t·l + r`` moves to ``r·seg + t``,
    zeros where no position lands (``layout = (l, m, seg)``, m = ⌈L/l⌉ <= seg)."""
    stride, m, seg = layout
    b, h, length, d = x.shape
    x = F.pad(x, (0, 0, 0, stride * m - length)).view(b, h, m, stride, d).transpose(2, 3)
    return F.pad(x, (0, 0, 0, seg - m)).reshape(b, h, stride * seg, d)


def _unpermute(x: Tensor, layout: tuple[int, int, int], length: int) -> Tensor:
    """The inverse of :func:`_permute`, back to the L positions."""
    stride, m, seg = layout
    b, h, _, d = x.shape
    x = x.view(b, h, stride, seg, d)[:, :, :, :m].transpose(2, 3)
    return x.reshape(b, h, m * stride, d)[:, :, :length]


def _strided_union(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    """The strided A(1) ∪ A(2): the band and the other positions of the query's residue class,
    merged into one softmax (the two parts share no pair)."""
    parts = [_band(q, k, v, opts), _residues(q, k, v, opts, with_self=False)]
    return merge_partial_attention(parts)


def _strided_band(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _band(q, k, v, opts)[0]


def _strided_residues(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _residues(q, k, v, opts, with_self=True)[0]


def _fixed(q: Tensor, k: Tensor, v: Tensor, opts: _Opts, *, own: bool, summaries: bool) -> Tensor:
    """The fixed pattern: the query's own block of l positions (``own``: a block table cut by
    a token mask), the summary keys as global keys (``summaries``), or both at once."""
    stride, causal, length = opts.stride, opts.causal, q.shape[2]
    bs = min(opts.block, stride, length)
    starts = _block_starts(length, bs, q.device)
    lo, hi = starts // stride * stride, ((starts + bs - 1) // stride + 1) * stride
    index, valid = _range_table(lo, hi, bs, starts.numel())

    def block(i: Tensor, j: Tensor) -> Tensor:
        same = i // stride == j // stride
        return same & (j <= i) if causal else same

    keys = None
    if summaries:
        first = torch.arange(-(-length // stride), device=q.device)[:, None] * stride
        keys = (first + torch.arange(stride - opts.c, stride, device=q.device)).flatten()
        keys = keys[keys < length]
    return block_sparse_attention_with_globals(
        q, k, v, index, block_size=bs, block_valid=valid if own else torch.zeros_like(valid),
        token_mask=block, global_keys=keys, causal=causal, key_padding_mask=opts.pad,
        scale=opts.scale,
    )  # fmt: skip


def _fixed_union(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _fixed(q, k, v, opts, own=True, summaries=True)


def _fixed_blocks(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _fixed(q, k, v, opts, own=True, summaries=False)


def _fixed_summaries(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _fixed(q, k, v, opts, own=False, summaries=True)


_Fn = Callable[[Tensor, Tensor, Tensor, _Opts], Tensor]
#: per pattern: the merged head, and the two factors (A(1), A(2)) of split heads.
_UNION: dict[str, _Fn] = {"strided": _strided_union, "fixed": _fixed_union}
_FACTORS: dict[str, tuple[_Fn, _Fn]] = {
    "strided": (_strided_band, _strided_residues),
    "fixed": (_fixed_blocks, _fixed_summaries),
}
