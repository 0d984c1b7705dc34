"""Longformer attention (Beltagy et al. 2020, §3.1): a sliding window, optionally dilated, plus
global tokens, exact softmax over that pattern on the block-sparse core.

Query i reads the keys ``j = i + d·m`` for ``−look_backward ≤ m ≤ look_forward`` (d the
dilation; ``m ≤ 0`` when causal) and every global key; a global query reads every key (``j ≤
i`` when causal). One softmax runs over the union, in O(L·(W + G)·D) time and O(L·(W + G))
memory (W = look_backward + look_forward + 1 keys in the window, G global tokens).

* Without dilation the window is a band of positions: the key blocks that overlap it are read
  through :func:`~kattn.functional.sparse_combine.block_sparse_attention_with_globals`, which
  also adds the global keys and queries.
* With dilation d, ``j ≡ i (mod d)``: the positions are regrouped by their residue mod d (each
  residue a contiguous segment of ``⌈L/d⌉`` positions), where the dilated window is again a
  band, so that no block holds keys the window skips. The window (without the global keys), the
  global keys and the global queries are then computed apart and joined into one softmax by
  :func:`~kattn.functional.sparse_combine.merge_partial_attention`.

:func:`longformer_pattern` writes the same pattern densely for
:func:`~kattn.functional.sparse.sparse_attention_reference`.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim, G global tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import int_at_least, positive_int
from .sparse import block_sparse_attention, sparse_attention_reference
from .sparse_combine import (
    add_global_tokens,
    block_sparse_attention_with_globals,
    global_positions,
    merge_partial_attention,
    with_global_queries,
)

__all__ = ["longformer_attention", "longformer_pattern"]

#: global positions as a 1-D integer tensor or a sequence of ints (None or empty: none).
Positions = Tensor | Sequence[int] | None


def longformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    look_backward: int,
    look_forward: int,
    dilation: int = 1,
    global_tokens: Positions = None,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    block_size: int = 64,
) -> Tensor:
    """Softmax attention over the dilated sliding window and the global tokens of Longformer
    (Beltagy et al. 2020, §3.1), in O(L·(W + G)·(D + Dv)) time and O(L·(W + G)) memory.

    Query i reads the keys ``i + dilation·m``, ``−look_backward ≤ m ≤ look_forward`` (``m ≤ 0``
    when causal: look_forward is then ignored), and the global keys (those ``≤ i`` when
    causal); a global query reads every key (``j ≤ i`` when causal). A key in both the window
    and the globals counts once.

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)`` (the window is on
            aligned positions, so Lq must equal Lk).
        look_backward: window steps before the query, an int >= 0.
        look_forward: window steps after it, an int >= 0 (ignored when causal).
        dilation: the gap between window keys, a positive int (1: a contiguous window).
        global_tokens: positions in ``[0, L)`` that are global keys and global queries (a
            1-D integer tensor or a sequence of ints; None or empty: none).
        causal: query i reads no key j > i.
        key_padding_mask: ``(B, L)`` bool, True marks padding (counted nowhere, global or not).
        scale: logit scale, default ``1/√D``.
        block_size: tokens per block of the block-sparse core (speed only, not the result).

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q; a query that sees only padding gets zeros.
    """
    back = int_at_least("look_backward", look_backward, 0)
    fwd = 0 if causal else int_at_least("look_forward", look_forward, 0)
    d = positive_int("dilation", dilation)
    bs = positive_int("block_size", block_size)
    if q.ndim == 4 and k.ndim == 4 and q.shape[2] != k.shape[2]:
        raise ValueError(
            "longformer attention needs Lq == Lk (the window is on aligned positions), got "
            f"Lq={q.shape[2]}, Lk={k.shape[2]}"
        )
    length = k.shape[2] if k.ndim == 4 else 0
    gk = global_positions("global_tokens", _as_tensor(global_tokens, q.device), max(length, 1))
    if q.ndim == 4 and 0 in (*q.shape[:2], length):
        # nothing to gather (an empty batch): the dense form, which is empty and cheap here
        allowed = longformer_pattern(max(length, 1), back, fwd, d, gk, causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed[:length, :length], key_padding_mask=key_padding_mask, scale=scale
        )
    if d == 1:
        n_blocks = -(-length // bs)
        index, valid, band = _band_table(n_blocks, bs, back, fwd, n_blocks, q.device)
        return block_sparse_attention_with_globals(
            q,
            k,
            v,
            index,
            block_size=bs,
            block_valid=valid,
            token_mask=band,
            global_keys=gk,
            global_queries=gk,
            causal=causal,
            key_padding_mask=key_padding_mask,
            scale=scale,
        )
    return _dilated(q, k, v, back, fwd, d, gk, causal, key_padding_mask, scale, bs)


def longformer_pattern(
    length: int,
    look_backward: int,
    look_forward: int,
    dilation: int = 1,
    global_tokens: Positions = None,
    causal: bool = False,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense pattern ``allowed (L, L)`` (bool) of :func:`longformer_attention`, from
    position comparisons: key j is in query i's window iff ``j − i = dilation·m`` with
    ``−look_backward ≤ m ≤ look_forward`` (``m ≤ 0`` when causal), and the global tokens are
    added by :func:`~kattn.functional.sparse_combine.add_global_tokens`. For the dense
    reference and tests; O(L²) memory."""
    length = positive_int("length", length)
    back = int_at_least("look_backward", look_backward, 0)
    fwd = 0 if causal else int_at_least("look_forward", look_forward, 0)
    d = positive_int("dilation", dilation)
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    gap = j - i
    allowed = (gap % d == 0) & (gap >= -back * d) & (gap <= fwd * d)
    gk = _as_tensor(global_tokens, allowed.device)
    return add_global_tokens(allowed, global_keys=gk, global_queries=gk, causal=causal)


def _as_tensor(positions: Positions, device: torch.device | str | None) -> Tensor | None:
    """Positions as a 1-D int64 tensor on ``device`` (None stays None)."""
    if positions is None or isinstance(positions, Tensor):
        return None if positions is None else positions.to(device)
    return torch.tensor(list(positions), dtype=torch.long, device=device).view(-1)


def _band_table(
    n_blocks: int, bs: int, back: int, fwd: int, segment: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """The block table of the band ``p − back ≤ p' ≤ p + fwd`` inside segments of ``segment``
    blocks, for a sequence of ``n_blocks`` blocks: ``index (nQ, K)``, ``valid (nQ, K)`` (the
    blocks that exist, in the query block's segment) and the per-token mask.

    Query block n reads the blocks ``n + span``, so the key in slot s of the gathered blocks
    sits ``span[s // bs]·bs + s mod bs − r`` positions from the query at offset r of its block,
    whatever n: one ``(block, K·block)`` bool mask serves every query block."""
    span = torch.arange(-back // bs, (bs - 1 + fwd) // bs + 1, device=device)
    own = torch.arange(n_blocks, device=device)[:, None]
    index = own + span
    valid = (index >= 0) & (index < n_blocks) & (index // segment == own // segment)
    offsets = torch.arange(bs, device=device)
    gap = (span[:, None] * bs + offsets).flatten()[None, :] - offsets[:, None]
    return index, valid, (gap >= -back) & (gap <= fwd)  # band: (block, K·block)


def _dilated(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    back: int,
    fwd: int,
    d: int,
    gk: Tensor | None,
    causal: bool,
    key_padding_mask: Tensor | None,
    scale: float | None,
    bs: int,
) -> Tensor:
    """The dilated window (:func:`_dilated_window`) merged with the global keys' part into
    one softmax; the global query rows are then computed densely over all keys."""
    out, lse = _dilated_window(q, k, v, back, fwd, d, gk, key_padding_mask, scale, bs)
    if gk is None:
        return out
    out = merge_partial_attention(
        [(out, lse), _global_keys_part(q, k, v, gk, causal, key_padding_mask, scale, bs)]
    )
    return with_global_queries(out, q, k, v, gk, causal, key_padding_mask, scale)


def _dilated_window(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    back: int,
    fwd: int,
    d: int,
    gk: Tensor | None,
    key_padding_mask: Tensor | None,
    scale: float | None,
    bs: int,
) -> tuple[Tensor, Tensor]:
    """Attention over the dilated window alone (the global keys left out), with its
    log-sum-exp: on the residue-major layout (:func:`_to_residues`) the window is the band
    ``−back ≤ p' − p ≤ fwd`` inside each residue's segment of ``seg`` positions (``⌈L/d⌉``
    rounded up to whole blocks, so that a block never straddles two residues)."""
    b, length = q.shape[0], q.shape[2]
    seg = -(-length // (d * bs)) * bs
    pad = key_padding_mask
    if pad is None:
        pad = torch.zeros(b, length, dtype=torch.bool, device=q.device)
    pad_r = _to_residues(F.pad(pad, (0, seg * d - length), value=True), d)
    q_r, k_r, v_r = (_to_residues(F.pad(x, (0, 0, 0, seg * d - length)), d) for x in (q, k, v))
    if gk is not None:  # the global keys are counted in their own part: padding here
        pad_r = pad_r.index_fill(1, (gk % d) * seg + gk // d, True)  # t·d + r is at r·seg + t
    index, valid, band = _band_table(seg * d // bs, bs, back, fwd, seg // bs, q.device)
    out, lse = block_sparse_attention(
        q_r,
        k_r,
        v_r,
        index,
        block_size=bs,
        block_valid=valid,
        token_mask=band,
        key_padding_mask=pad_r,
        scale=scale,
        return_lse=True,
    )
    return _from_residues(out, d, length), _from_residues(lse[..., None], d, length)[..., 0]


def _global_keys_part(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor,
    causal: bool,
    key_padding_mask: Tensor | None,
    scale: float | None,
    bs: int,
) -> tuple[Tensor, Tensor]:
    """Attention of every query over the global keys alone (``g ≤ i`` when causal), with its
    log-sum-exp: every query block reads all the blocks of the gathered global keys."""
    n_q, n_g = -(-q.shape[2] // bs), -(-gk.numel() // bs)
    index = torch.arange(n_g, device=q.device).expand(n_q, n_g)

    def before(i: Tensor, j: Tensor) -> Tensor:
        return gk[j.clamp(max=gk.numel() - 1)] <= i

    return block_sparse_attention(
        q,
        k.index_select(2, gk),
        v.index_select(2, gk),
        index,
        block_size=bs,
        token_mask=before if causal else None,
        key_padding_mask=None if key_padding_mask is None else key_padding_mask[:, gk],
        scale=scale,
        return_lse=True,
    )


def _to_residues(x: Tensor, d: int) -> Tensor:
    """Position ``t·d + r`` moved to ``r·seg + t`` (x: ``(B, H, seg·d, ·)``, or a ``(B,
    seg·d)`` mask), so that each residue class mod d is one contiguous segment."""
    dim = 2 if x.ndim == 4 else 1
    split = (*x.shape[:dim], x.shape[dim] // d, d, *x.shape[dim + 1 :])
    return x.reshape(split).transpose(dim, dim + 1).reshape(x.shape)


def _from_residues(x: Tensor, d: int, length: int) -> Tensor:
    """The inverse of :func:`_to_residues` on ``(B, H, seg·d, ·)``, cut to ``length``."""
    b, h, n, c = x.shape
    return x.reshape(b, h, d, n // d, c).transpose(2, 3).reshape(b, h, n, c)[:, :, :length]
