"""Local (sliding-window) softmax attention in two variants, both on the block-sparse core
(:func:`~kattn.functional.sparse.block_sparse_attention`), the Local Attention baseline of
Long Range Arena (Tay et al., ICLR 2021) and the local pattern of the Sparse Transformer
(Child et al. 2019).

* The exact per-token band (:func:`local_attention`): query i reads the keys j with
  ``i − look_backward ≤ j ≤ i + look_forward`` (only ``j ≤ i`` when causal).
* The blocked form (:func:`local_blocked_attention`): the sequence is cut into blocks of
  ``window`` tokens and query block n reads the whole key blocks ``n − look_backward … n +
  look_forward`` (causal: blocks ``n − look_backward … n`` and, inside block n, ``j ≤ i``).

The band is the blocked form with blocks of one token, so both run through one path: each
query block of the core reads the key blocks that its window overlaps and a per-token mask
cuts the window exactly, in O(L·W·D) time and O(L·W) memory (W the widest window).
Decoding keeps a ring buffer of the last ``(look_backward + 1)·window`` keys and values
(:class:`LocalState`; window 1 for the exact band): O(W·D) memory and time per token
whatever the context length; a prefill reads a prompt in one parallel pass.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim, W the number
of positions in the ring buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int
from .numerics import accumulation_dtype, autocast_off
from .sparse import block_sparse_attention, sparse_attention_reference

__all__ = [
    "LocalState",
    "local_attention",
    "local_blocked_attention",
    "local_blocked_pattern",
    "local_init_state",
    "local_pattern",
    "local_prefill",
    "local_step",
]

#: tokens per block of the core when prefilling (at most; fewer for a smaller ring buffer).
_PREFILL_BLOCK = 64


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    look_backward: int,
    look_forward: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    block_size: int = 64,
) -> Tensor:
    """Softmax attention over the band ``i − look_backward ≤ j ≤ i + look_forward`` of each
    query i (``j ≤ i`` as well when causal, so look_forward is then ignored), through
    :func:`~kattn.functional.sparse.block_sparse_attention`, in O(L·W·(D + Dv)) time and
    O(L·W) memory, W = look_backward + look_forward + 1 (plus up to two blocks).

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)`` (the band is defined
            on aligned positions, so Lq must equal Lk).
        look_backward: keys before the query that it reads, an int >= 0.
        look_forward: keys after the query that it reads, an int >= 0 (ignored when causal).
        causal: query i reads no key j > i.
        key_padding_mask: ``(B, L)`` bool, True marks padding (counted nowhere).
        scale: logit scale, default ``1/√D``.
        block_size: tokens per block of the block-sparse core (a speed knob only: the result
            does not depend on it).

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q; a query whose band holds only padding gets zeros.
    """
    back = int_at_least("look_backward", look_backward, 0)
    fwd = int_at_least("look_forward", look_forward, 0)
    fwd = 0 if causal else fwd
    bs = positive_int("block_size", block_size)
    # the band is the blocked form with blocks of one token
    return _window_attention(q, k, v, (1, back, fwd, causal), bs, key_padding_mask, scale)


def local_blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    look_backward: int = 1,
    look_forward: int | None = None,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    block_size: int | None = None,
) -> Tensor:
    """Blocked local attention: positions cut into blocks of ``window`` tokens (the last one
    partial when ``window`` does not divide L), and a query in block ``n = ⌊i/window⌋`` reads
    every key of the blocks ``n − look_backward … n + look_forward`` that exists (causal:
    blocks ``n − look_backward … n``, and ``j ≤ i``). In O(L·W·(D + Dv)) time and O(L·W)
    memory, W = (look_backward + look_forward + 1)·window. This is the ``look_around``
    bucketing of lucidrains' ``local-attention`` (``LocalAttention(window_size=window,
    look_backward, look_forward, exact_windowsize=False)``), and with look_backward =
    look_forward = 0 the block-diagonal pattern of the LRA local baseline.

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)`` (Lq == Lk).
        window: tokens per block, a positive int.
        look_backward: whole blocks before the query's block that it reads, an int >= 0.
        look_forward: blocks after it (ignored when causal), an int >= 0; None: 1, or 0 when
            causal (lucidrains' default).
        causal: query i reads no key j > i.
        key_padding_mask: ``(B, L)`` bool, True marks padding (counted nowhere).
        scale: logit scale, default ``1/√D``.
        block_size: tokens per block of the core (speed only); None: ``window``.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q; a query whose blocks hold only padding gets zeros.
    """
    w = positive_int("window", window)
    back = int_at_least("look_backward", look_backward, 0)
    fwd = 1 if look_forward is None else int_at_least("look_forward", look_forward, 0)
    fwd = 0 if causal else fwd
    bs = w if block_size is None else positive_int("block_size", block_size)
    return _window_attention(q, k, v, (w, back, fwd, causal), bs, key_padding_mask, scale)


def local_pattern(
    lq: int,
    lk: int,
    look_backward: int,
    look_forward: int,
    causal: bool = False,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense band ``allowed (Lq, Lk)`` (bool) of :func:`local_attention`, from position
    comparisons alone (no blocks): for :func:`~kattn.functional.sparse.sparse_attention_reference`
    and tests. O(Lq·Lk) memory."""
    lq, lk = positive_int("lq", lq), positive_int("lk", lk)
    back = int_at_least("look_backward", look_backward, 0)
    fwd = int_at_least("look_forward", look_forward, 0)
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    allowed = (j >= i - back) & (j <= i + fwd)
    if causal:
        allowed = allowed & (j <= i)
    return allowed


def local_blocked_pattern(
    lq: int,
    lk: int,
    window: int,
    look_backward: int = 1,
    look_forward: int | None = None,
    causal: bool = False,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense pattern ``allowed (Lq, Lk)`` (bool) of :func:`local_blocked_attention`, from
    the block numbers ``⌊i/window⌋`` and ``⌊j/window⌋`` alone: key j is read by query i iff
    ``−look_backward ≤ ⌊j/window⌋ − ⌊i/window⌋ ≤ look_forward`` (and ``j ≤ i`` when causal,
    look_forward then 0). For the dense reference and tests; O(Lq·Lk) memory."""
    lq, lk = positive_int("lq", lq), positive_int("lk", lk)
    w = positive_int("window", window)
    back = int_at_least("look_backward", look_backward, 0)
    fwd = 1 if look_forward is None else int_at_least("look_forward", look_forward, 0)
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    gap = j // w - i // w  # blocks from the query's block to the key's
    if causal:
        return (gap >= -back) & (j <= i)
    return (gap >= -back) & (gap <= fwd)


def _window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    blocks: tuple[int, int, int, bool],
    block_size: int,
    key_padding_mask: Tensor | None,
    scale: float | None,
    *,
    offset: int = 0,
    first: int = 0,
) -> Tensor:
    """Blocked local attention, ``blocks = (window, look_backward, look_forward, causal)``
    as in :func:`local_blocked_attention`, for queries at key index ``i + offset`` and keys
    at absolute positions ``first + j`` (0, 0 for self-attention; a prefill puts the buffered
    keys first): each query block of the core reads the key blocks that its window overlaps,
    and a per-token mask cuts the window exactly."""
    w, back, fwd, causal = blocks
    if q.ndim == 4 and k.ndim == 4 and q.shape[2] + offset != k.shape[2]:
        raise ValueError(
            f"local attention needs Lq == Lk (the window is on aligned positions), got "
            f"Lq={q.shape[2]}, Lk={k.shape[2]}"
        )

    def window(qpos: Tensor, kpos: Tensor) -> Tensor:
        t, j = qpos + offset + first, kpos + first  # absolute positions
        gap = j // w - t // w  # blocks from the query's block to the key's
        return (gap >= -back) & ((j <= t) if causal else (gap <= fwd))

    if q.ndim == 4 and k.ndim == 4 and 0 in (*q.shape[:3], k.shape[2]):
        # nothing to gather (an empty batch): the dense form, which is empty and cheap here
        i, j = torch.arange(q.shape[2]), torch.arange(k.shape[2])
        allowed = window(i[:, None], j[None, :]).to(q.device)
        return sparse_attention_reference(
            q, k, v, allowed, key_padding_mask=key_padding_mask, scale=scale
        )
    bs = block_size
    n_q = -(-q.shape[2] // bs) if q.ndim == 4 else 1
    n_k = -(-k.shape[2] // bs) if k.ndim == 4 else 1
    # the key index − query index of a read key: from −(back·w + w − 1) to (fwd + 1)·w − 1
    reach = (offset - back * w - w + 1, offset + (0 if causal else (fwd + 1) * w - 1))
    span = torch.arange(reach[0] // bs, (bs - 1 + reach[1]) // bs + 1, device=q.device)
    index = torch.arange(n_q, device=q.device)[:, None] + span  # (nQ, K)
    token_mask: Tensor | Callable[[Tensor, Tensor], Tensor] = window
    if bs % w == 0:
        # shifting a query block and its keys by bs shifts ⌊·/w⌋ of both alike: every query
        # block has the mask of block 0, one (block, K·block) tensor instead of a callable
        rows = torch.arange(bs, device=q.device)
        token_mask = window(rows[:, None], (span[:, None] * bs + rows).flatten()[None, :])
    return block_sparse_attention(
        q,
        k,
        v,
        index,
        block_size=bs,
        block_valid=(index >= 0) & (index < n_k),
        token_mask=token_mask,
        key_padding_mask=key_padding_mask,
        scale=scale,
    )


class LocalState(NamedTuple):
    """Decoding state of local attention: a ring buffer of the last W keys and values.

    Attributes:
        keys: ``(B, H, W, D)``; values: ``(B, H, W, Dv)`` (Dv is 0 until the first token).
            Position t lives in slot ``t mod W``; slots ``>= length`` are empty. The buffers
            never grow: memory is O(W·(D + Dv)) whatever the context. Steps build new buffers
            (no writes into earlier states), so states may be branched freely.
        length: tokens read so far.
        window: tokens per block. The token at position t reads the positions
            ``(⌊t/window⌋ + 1)·window − W … t``: its own (partial) block and the
            ``W/window − 1`` whole blocks before it; with window 1 (the exact band), the
            last W positions.
    """

    keys: Tensor
    values: Tensor
    length: int
    window: int = 1


def local_init_state(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    look_backward: int,
    *,
    window: int = 1,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> LocalState:
    """The empty ring buffer for causal decoding: W = (look_backward + 1)·window slots. With
    window 1 (the exact band) look_backward counts keys before each token; in the blocked
    form it counts whole blocks of ``window`` tokens. The first token sets the value dim Dv."""
    positive_int("batch_size", batch_size)
    positive_int("num_heads", num_heads)
    positive_int("head_dim", head_dim)
    block = positive_int("window", window)
    w = (int_at_least("look_backward", look_backward, 0) + 1) * block
    return LocalState(
        torch.zeros(batch_size, num_heads, w, head_dim, device=device, dtype=dtype),
        torch.zeros(batch_size, num_heads, w, 0, device=device, dtype=dtype),
        0,
        block,
    )


def local_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, state: LocalState, *, scale: float | None = None
) -> tuple[Tensor, LocalState]:
    """One causal token at position t: write k_t, v_t into slot ``t mod W`` and attend to the
    slots whose position is in the token's window (:class:`LocalState`), in O(W·(D + Dv)).

    Args:
        q_t, k_t: ``(B, H, 1, D)``; v_t: ``(B, H, 1, Dv)``.
        state: from :func:`local_init_state` or the previous step.
        scale: logit scale, default ``1/√D``.

    Returns:
        The output ``(B, H, 1, Dv)`` in the dtype of q_t and the state with this token.
    """
    keys, values, t, block = _checked_state(state, q_t, k_t, v_t, step=True)
    w = keys.shape[2]
    slot = t % w
    store = torch.promote_types(keys.dtype, k_t.dtype)  # never round below the inputs
    keys, values = keys.to(store), values.to(store)
    keys = torch.cat([keys[:, :, :slot], k_t.to(keys.dtype), keys[:, :, slot + 1 :]], dim=2)
    values = torch.cat([values[:, :, :slot], v_t.to(values.dtype), values[:, :, slot + 1 :]], dim=2)
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    acc = torch.promote_types(accumulation_dtype(q_t.dtype), keys.dtype)
    with autocast_off(q_t):
        logits = torch.einsum("bhid,bhjd->bhij", q_t.to(acc), keys.to(acc)) * scale
        held = t - (t - torch.arange(w, device=keys.device)) % w  # the position in each slot
        seen = held >= max(0, _first_visible(t, block, w))
        logits = logits.masked_fill(~seen, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        out = weights @ values.to(acc)
    return out.to(q_t.dtype), LocalState(keys, values, t + 1, block)


def local_prefill(
    q: Tensor, k: Tensor, v: Tensor, state: LocalState, *, scale: float | None = None
) -> tuple[Tensor, LocalState]:
    """L causal tokens following ``state`` in one parallel pass, equal to L calls of
    :func:`local_step`: the filled slots of the ring buffer, in position order, go before the
    new keys and values, the block-sparse core reads each new token's window from them, and
    the new buffer holds the last W positions (slot = position mod W). O((L + W)·W·(D + Dv))
    time, O((L + W)·W) memory.

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)``, L >= 1.
        state: from :func:`local_init_state`, a step or a prefill.
        scale: logit scale, default ``1/√D``.

    Returns:
        The outputs ``(B, H, L, Dv)`` in the dtype of q and the state after the L tokens.
    """
    if q.ndim == 4 and q.shape[2] == 0:
        raise ValueError("local_prefill needs at least one position, got L=0")
    keys, values, t0, block = _checked_state(state, q, k, v, step=False)
    b, h, w, _ = keys.shape
    store = torch.promote_types(keys.dtype, k.dtype)
    past = torch.arange(max(0, t0 - w), t0, device=keys.device) % w  # filled, in position order
    k_all = torch.cat([keys.index_select(2, past).to(store), k.to(store)], dim=2)
    v_all = torch.cat([values.index_select(2, past).to(store), v.to(store)], dim=2)
    q_, n_past, bs = q.to(torch.promote_types(q.dtype, store)), past.numel(), min(_PREFILL_BLOCK, w)
    blocks = (block, w // block - 1, 0, True)  # W = (look_backward + 1)·window
    out = _window_attention(
        q_, k_all, v_all, blocks, bs, None, scale, offset=n_past, first=t0 - n_past
    )
    end = t0 + q.shape[2]
    n = min(w, end)
    slots = torch.arange(end - n, end, device=keys.device) % w
    keys = k_all.new_zeros(b, h, w, k_all.shape[-1]).index_copy(2, slots, k_all[:, :, -n:])
    values = v_all.new_zeros(b, h, w, v_all.shape[-1]).index_copy(2, slots, v_all[:, :, -n:])
    return out.to(q.dtype), LocalState(keys, values, end, block)


def _first_visible(t: Any, window: int, slots: int) -> Any:
    """The first position that the token at position t reads (int or Tensor t): the start of
    its block, less the ``slots/window − 1`` whole blocks before it."""
    return (t // window + 1) * window - slots


def _checked_state(
    state: Any, q: Tensor, k: Tensor, v: Tensor, *, step: bool
) -> tuple[Tensor, Tensor, int, int]:
    """The ring buffer, length and window of ``state`` (values allocated with the value dim
    on the first token), or ValueError for a foreign state or inputs of the wrong shape."""
    if not isinstance(state, LocalState):
        raise ValueError(
            f"state must be a LocalState (from local_init_state), got {type(state).__name__}"
        )
    keys, values, length, block = state
    b, h, w, d = keys.shape
    if not (isinstance(block, int) and block >= 1 and w % block == 0):
        raise ValueError(f"state.window must be a positive int dividing W={w}, got {block!r}")
    n = 1 if step or q.ndim != 4 else q.shape[2]
    names, vname, ln = ("q_t and k_t", "v_t", "1") if step else ("q and k", "v", "L")
    if q.shape[:3] != (b, h, n) or k.shape != q.shape or k.shape[-1] != d:
        raise ValueError(
            f"{names} must be (B, H, {ln}, D) = {(b, h, n, d)} for this state, got shapes "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    dv = v.shape[-1]
    if length == 0 and values.shape[-1] != dv:
        values = values.new_zeros(b, h, w, dv)
    if v.shape != (b, h, n, values.shape[-1]):
        raise ValueError(
            f"{vname} must be (B, H, {ln}, Dv) = {(b, h, n, values.shape[-1])} for this state, "
            f"got shape {tuple(v.shape)}"
        )
    return keys, values, length, block
