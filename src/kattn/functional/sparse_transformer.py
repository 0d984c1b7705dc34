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

No ``(L, L)`` tensor is formed. Strided A(1) is a band: each query block reads the key blocks
the band reaches, cut by one mask of offsets. Strided A(2) uses the transpose of the paper's
kernels: the sequence permuted by ``(i mod l, ⌊i/l⌋)`` makes each residue class a contiguous
segment of ⌈L/l⌉ positions, attention runs inside segments, and the output is permuted back.
The fixed pattern is taken in blocks of l: A(1) is attention inside each block, and the
summaries of the other blocks (causal: the earlier ones) are gathered into a sequence of
⌈L/l⌉·c keys that every query block reads, cut by a mask of block numbers. A union is its
two disjoint parts merged into one softmax with
:func:`~kattn.functional.sparse_combine.merge_partial_attention` (strided: the query itself
left out of the A(2) part; fixed: a block's own summaries counted in A(1)); split fixed heads
read A(2) alone as global keys
(:func:`~kattn.functional.sparse_combine.block_sparse_attention_with_globals`; its per-token
callable mask makes it slower than the merged parts above). Time O(L·(l + L/l)·(D + Dv)) strided,
O(L·(l + c·L/l)·(D + Dv)) fixed; memory O(L·(l + L/l)) and O(L·(l + c·L/l)).

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
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(
            f"q, k and v must be (B, H, L, D) tensors, got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    stride, c = _checked_options(pattern, stride, c, heads, q.shape[1])
    bs = positive_int("block_size", block_size)
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            "the Sparse Transformer pattern needs Lq == Lk (it is defined on aligned "
            f"positions), got Lq={q.shape[2]}, Lk={k.shape[2]}"
        )
    if 0 in (*q.shape[:3], k.shape[2]):
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
    length = q.shape[-2]
    allowed = sparse_transformer_pattern(
        max(length, 1), pattern=pattern, stride=stride, c=c, heads=heads,
        num_heads=q.shape[1] if q.ndim == 4 else 1, causal=causal, device=q.device,
    )  # fmt: skip
    allowed = allowed[:, :length, :length]
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


def _band(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> _Part:
    """Strided A(1), ``i − l < j ≤ i`` (causal) or ``|i − j| < l``, and its lse: query block
    n reads the key blocks ``n + o`` that the band reaches, cut by one ``(block, K·block)``
    mask of the offsets j − i, the same for every query block."""
    stride, causal, length = opts.stride, opts.causal, q.shape[2]
    bs = min(opts.block, length)
    n = -(-length // bs)
    ahead = 0 if causal else stride - 1  # the largest j − i read
    offsets = torch.arange(-((stride + bs - 2) // bs), (ahead + bs - 1) // bs + 1, device=q.device)
    index = torch.arange(n, device=q.device)[:, None] + offsets
    rows = torch.arange(bs, device=q.device)
    gap = (offsets[:, None] * bs + rows).flatten() - rows[:, None]  # (block, K·block): j − i
    return block_sparse_attention(
        q, k, v, index, block_size=bs, block_valid=(index >= 0) & (index < n),
        token_mask=(gap > -stride) & (gap <= ahead), key_padding_mask=opts.pad,
        scale=opts.scale, return_lse=True,
    )  # fmt: skip


def _residues(q: Tensor, k: Tensor, v: Tensor, opts: _Opts, *, with_self: bool) -> _Part:
    """Strided A(2), ``(i − j) mod l = 0`` (and ``j ≤ i`` when causal; ``j ≠ i`` unless
    ``with_self``), and its lse: the sequence permuted by ``(i mod l, ⌊i/l⌋)`` makes each
    residue class a segment, attention runs inside the segments, and is permuted back."""
    length = q.shape[2]
    stride = min(opts.stride, length)  # for L <= l every class is one position either way
    m = -(-length // stride)  # positions per residue class, at most

    def permute(x: Tensor, value: bool | float = 0.0) -> Tensor:  # (…, L, F) → (…, l, m, F)
        return _segments(x, m, stride, value).transpose(-3, -2)

    out, lse = _within(
        permute(q), permute(k), permute(v), permute(_padding(opts.pad, q), True)[..., 0], opts,
        with_self=with_self,
    )  # fmt: skip
    return _joined(out.transpose(2, 3), length), _joined(lse.transpose(2, 3), length)


def _segments(x: Tensor, s: int, m: int, value: bool | float = 0.0) -> Tensor:
    """``(…, L, F)`` → ``(…, s, m, F)``: consecutive segments of m positions, filled with
    ``value`` past L."""
    x = F.pad(x, (0, 0, 0, s * m - x.shape[-2]), value=value)
    return x.view(*x.shape[:-2], s, m, x.shape[-1])


def _joined(x: Tensor, length: int) -> Tensor:
    """``(B, H, s, m, …)`` → ``(B, H, L, …)``: the segments end to end, cut to L positions."""
    return x.flatten(2, 3)[:, :, :length]


def _padding(pad: Tensor | None, q: Tensor) -> Tensor:
    """The key padding mask as ``(B, L, 1)`` bool (False everywhere when None)."""
    if pad is None:
        return torch.zeros(q.shape[0], q.shape[2], 1, dtype=torch.bool, device=q.device)
    return pad[:, :, None]


def _within(q: Tensor, k: Tensor, v: Tensor, pad: Tensor, opts: _Opts, *, with_self: bool) -> _Part:
    """Attention inside segments, q ``(B, H, S, m, D)``, k, v alike, pad ``(B, S, m)``: query
    t of a segment reads its keys u (``u ≤ t`` when causal; ``u ≠ t`` unless ``with_self``).
    Segments are padded to whole core blocks; a query block reads its segment's blocks (when
    causal, those up to its own), cut by a mask of the positions inside the segment."""
    b, h, s, m, _ = q.shape
    bs = min(opts.block, m)
    per = -(-m // bs)  # core blocks per segment
    seg = per * bs

    def flat(x: Tensor, value: bool | float = 0.0) -> Tensor:
        return F.pad(x, (0, 0, 0, seg - m), value=value).flatten(-3, -2)

    n = s * per
    block = torch.arange(n, device=q.device)
    index = (block // per * per)[:, None] + torch.arange(per, device=q.device)
    mask = None
    if opts.causal or not with_self:  # (nQ, block, seg): by the positions t, u in the segment
        u = torch.arange(seg, device=q.device)
        t = u.view(per, bs, 1)
        mask = u <= t if opts.causal else torch.ones_like(u, dtype=torch.bool).expand(per, bs, -1)
        mask = mask if with_self else mask & (u != t)
        mask = mask.expand(s, per, bs, seg).reshape(n, bs, seg)
    out, lse = block_sparse_attention(
        flat(q), flat(k), flat(v), index, block_size=bs,
        block_valid=index <= block[:, None] if opts.causal else None, token_mask=mask,
        key_padding_mask=flat(pad[..., None], True)[..., 0], scale=opts.scale, return_lse=True,
    )  # fmt: skip
    return out.view(b, h, s, seg, -1)[:, :, :, :m], lse.view(b, h, s, seg)[..., :m]


def _strided_union(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    """The strided A(1) ∪ A(2): the band and the other positions of the query's residue class,
    merged into one softmax (the two parts share no pair)."""
    parts = [_band(q, k, v, opts), _residues(q, k, v, opts, with_self=False)]
    return merge_partial_attention(parts)


def _strided_band(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _band(q, k, v, opts)[0]


def _strided_residues(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    return _residues(q, k, v, opts, with_self=True)[0]


def _other_summaries(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> _Part:
    """The summary keys of the blocks other than the query's (causal: of earlier blocks), q
    in blocks ``(B, H, S, l, D)``, k and v ``(B, H, L, ·)``: the S·c summaries are gathered
    into a short key sequence that every query block reads, cut by a mask of block numbers."""
    b, h, s, stride, _ = q.shape
    length, c, dev = k.shape[2], opts.c, q.device
    bs = min(opts.block, stride)
    per = -(-stride // bs)
    n, n_keys = s * per, -(-(s * c) // bs)
    first = torch.arange(s, device=dev)[:, None] * stride
    pos = (first + torch.arange(stride - c, stride, device=dev)).flatten()  # the summaries
    real = (pos < length)[None]
    pos = pos.clamp(max=length - 1)
    pad = ~real if opts.pad is None else ~real | opts.pad[:, pos]
    key_block = F.pad(torch.arange(s * c, device=dev) // c, (0, n_keys * bs - s * c), value=s)
    query_block = torch.arange(n, device=dev)[:, None] // per
    mask = key_block < query_block if opts.causal else key_block != query_block  # (nQ, K·block)
    table = torch.arange(n_keys, device=dev).expand(n, n_keys)
    out, lse = block_sparse_attention(
        F.pad(q, (0, 0, 0, per * bs - stride)).flatten(2, 3), k[:, :, pos], v[:, :, pos], table,
        block_size=bs, token_mask=mask[:, None], key_padding_mask=pad.expand(b, -1),
        scale=opts.scale, return_lse=True,
    )  # fmt: skip
    out, lse = out.view(b, h, s, per * bs, -1), lse.view(b, h, s, per * bs)
    return out[:, :, :, :stride], lse[..., :stride]


def _fixed_union(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    """The fixed A(1) ∪ A(2), in blocks of l: the query's own block (which holds its block's
    summaries) merged with the summaries of the other blocks into one softmax."""
    s = -(-q.shape[2] // opts.stride)
    qs, ks, vs = (_segments(x, s, opts.stride) for x in (q, k, v))
    pad = _segments(_padding(opts.pad, q), s, opts.stride, True)[..., 0]
    own = _within(qs, ks, vs, pad, opts, with_self=True)
    return _joined(merge_partial_attention([own, _other_summaries(qs, k, v, opts)]), q.shape[2])


def _fixed_blocks(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    """The fixed A(1): attention inside blocks of l positions."""
    s = -(-q.shape[2] // opts.stride)
    qs, ks, vs = (_segments(x, s, opts.stride) for x in (q, k, v))
    pad = _segments(_padding(opts.pad, q), s, opts.stride, True)[..., 0]
    return _joined(_within(qs, ks, vs, pad, opts, with_self=True)[0], q.shape[2])


def _fixed_summaries(q: Tensor, k: Tensor, v: Tensor, opts: _Opts) -> Tensor:
    """The fixed A(2) alone: the summary positions as global keys (``g ≤ i`` when causal)."""
    length, stride = q.shape[2], opts.stride
    first = torch.arange(-(-length // stride), device=q.device)[:, None] * stride
    keys = (first + torch.arange(stride - opts.c, stride, device=q.device)).flatten()
    bs = min(opts.block, length)
    none = torch.zeros(-(-length // bs), 1, dtype=torch.long, device=q.device)  # no own blocks
    return block_sparse_attention_with_globals(
        q, k, v, none, block_size=bs, block_valid=none > 0, global_keys=keys[keys < length],
        causal=opts.causal, key_padding_mask=opts.pad, scale=opts.scale,
    )  # fmt: skip


_Fn = Callable[[Tensor, Tensor, Tensor, _Opts], Tensor]
#: per pattern: the merged head, and the two factors (A(1), A(2)) of split heads.
_UNION: dict[str, _Fn] = {"strided": _strided_union, "fixed": _fixed_union}
_FACTORS: dict[str, tuple[_Fn, _Fn]] = {
    "strided": (_strided_band, _strided_residues),
    "fixed": (_fixed_blocks, _fixed_summaries),
}
