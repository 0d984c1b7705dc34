"""Local (sliding-window) softmax attention: query i reads the keys j with
``i − look_backward ≤ j ≤ i + look_forward`` (only ``j ≤ i`` when causal), the Local
Attention baseline of Long Range Arena (Tay et al., ICLR 2021) and the local pattern of the
Sparse Transformer (Child et al. 2019).

This is the exact per-token band, computed on the block-sparse core
(:func:`~kattn.functional.sparse.block_sparse_attention`): each query block reads the key
blocks that overlap its band, and a per-token mask cuts the band exactly, in O(L·W·D) time and
O(L·W) memory (W = look_backward + look_forward + 1). The blocked variant of the LRA code
(each block reads whole neighbouring blocks) is not implemented here yet.

Decoding keeps a ring buffer of the last ``look_backward + 1`` keys and values
(:class:`LocalState`): O(W·D) memory and time per token whatever the context length.

Shapes: B batch, H heads, L length (Lq == Lk), D query/key dim, Dv value dim, W the number
of positions in the ring buffer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int
from .numerics import accumulation_dtype, autocast_off
from .sparse import block_sparse_attention, sparse_attention_reference

__all__ = [
    "LocalState",
    "local_attention",
    "local_init_state",
    "local_pattern",
    "local_prefill",
    "local_step",
]


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
    fwd = 0 if causal else int_at_least("look_forward", look_forward, 0)
    if causal:
        int_at_least("look_forward", look_forward, 0)
    bs = positive_int("block_size", block_size)
    if q.ndim == 4 and k.ndim == 4 and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"local attention needs Lq == Lk (the window is on aligned positions), got "
            f"Lq={q.shape[2]}, Lk={k.shape[2]}"
        )
    if q.ndim == 4 and k.ndim == 4 and 0 in (*q.shape[:2], k.shape[2]):
        # nothing to gather (an empty batch): the dense form, which is empty and cheap here
        allowed = local_pattern(
            max(q.shape[2], 1), max(k.shape[2], 1), back, fwd, causal, device=q.device
        )[: q.shape[2], : k.shape[2]]
        return sparse_attention_reference(
            q, k, v, allowed, key_padding_mask=key_padding_mask, scale=scale
        )
    n_blocks = -(-k.shape[2] // bs) if k.ndim == 4 else 1
    first = -(-back // bs)  # key blocks before the query block that the band reaches
    last = (bs - 1 + fwd) // bs  # key blocks after it
    offsets = torch.arange(-first, last + 1, device=q.device)
    index = torch.arange(n_blocks, device=q.device)[:, None] + offsets  # (nQ, K)
    valid = (index >= 0) & (index < n_blocks)

    def band(i: Tensor, j: Tensor) -> Tensor:
        return (j >= i - back) & (j <= i + fwd)

    return block_sparse_attention(
        q,
        k,
        v,
        index,
        block_size=bs,
        block_valid=valid,
        token_mask=band,
        key_padding_mask=key_padding_mask,
        scale=scale,
    )


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


class LocalState(NamedTuple):
    """Decoding state of local attention: a ring buffer of the last W keys and values.

    Attributes:
        keys: ``(B, H, W, D)``; values: ``(B, H, W, Dv)`` (Dv is 0 until the first step).
            Position t lives in slot ``t mod W``; slots ``>= length`` are empty. The buffers
            never grow: memory is O(W·(D + Dv)) whatever the context. Steps build new buffers
            (no writes into earlier states), so states may be branched freely.
        length: tokens read so far.
    """

    keys: Tensor
    values: Tensor
    length: int


def local_init_state(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    look_backward: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> LocalState:
    """The empty ring buffer for causal decoding with ``look_backward`` keys before each
    token (W = look_backward + 1 slots; the first step sets the value dim Dv)."""
    positive_int("batch_size", batch_size)
    positive_int("num_heads", num_heads)
    positive_int("head_dim", head_dim)
    w = int_at_least("look_backward", look_backward, 0) + 1
    return LocalState(
        torch.zeros(batch_size, num_heads, w, head_dim, device=device, dtype=dtype),
        torch.zeros(batch_size, num_heads, w, 0, device=device, dtype=dtype),
        0,
    )


def local_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, state: LocalState, *, scale: float | None = None
) -> tuple[Tensor, LocalState]:
    """One causal token at position t: write k_t, v_t into slot ``t mod W`` and attend to the
    ``min(t + 1, W)`` filled slots (the token and the W − 1 before it), in O(W·(D + Dv)).

    Args:
        q_t, k_t: ``(B, H, 1, D)``; v_t: ``(B, H, 1, Dv)``.
        state: from :func:`local_init_state` or the previous step.
        scale: logit scale, default ``1/√D``.

    Returns:
        The output ``(B, H, 1, Dv)`` in the dtype of q_t and the state with this token.
    """
    keys, values, length = _checked_state(state, q_t, k_t, v_t)
    w = keys.shape[2]
    slot = length % w
    store = torch.promote_types(keys.dtype, k_t.dtype)  # never round below the inputs
    keys, values = keys.to(store), values.to(store)
    keys = torch.cat([keys[:, :, :slot], k_t.to(keys.dtype), keys[:, :, slot + 1 :]], dim=2)
    values = torch.cat([values[:, :, :slot], v_t.to(values.dtype), values[:, :, slot + 1 :]], dim=2)
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    acc = torch.promote_types(accumulation_dtype(q_t.dtype), keys.dtype)
    with autocast_off(q_t):
        logits = torch.einsum("bhid,bhjd->bhij", q_t.to(acc), keys.to(acc)) * scale
        filled = torch.arange(w, device=keys.device) <= length  # slots 0..min(t, W−1)
        logits = logits.masked_fill(~filled, float("-inf"))
        weights = torch.softmax(logits, dim=-1)
        out = weights @ values.to(acc)
    return out.to(q_t.dtype), LocalState(keys, values, length + 1)


def local_prefill(
    q: Tensor, k: Tensor, v: Tensor, state: LocalState, *, scale: float | None = None
) -> tuple[Tensor, LocalState]:
    """L causal tokens following ``state``, token by token through :func:`local_step`
    (O(L·W·(D + Dv))): the outputs ``(B, H, L, Dv)`` and the state after them."""
    outs = []
    for t in range(q.shape[2]):
        out, state = local_step(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, scale=scale
        )
        outs.append(out)
    if not outs:
        raise ValueError("local_prefill needs at least one position, got L=0")
    return torch.cat(outs, dim=2), state


def _checked_state(state: Any, q_t: Tensor, k_t: Tensor, v_t: Tensor) -> tuple[Tensor, Tensor, int]:
    """The ring buffer of ``state`` (values allocated with the value dim on the first step),
    or ValueError for a foreign state or inputs of the wrong shape."""
    if not isinstance(state, LocalState):
        raise ValueError(
            f"state must be a LocalState (from local_init_state), got {type(state).__name__}"
        )
    keys, values, length = state
    b, h, w, d = keys.shape
    if q_t.shape[:3] != (b, h, 1) or k_t.shape != q_t.shape or k_t.shape[-1] != d:
        raise ValueError(
            f"q_t and k_t must be (B, H, 1, D) = {(b, h, 1, d)} for this state, got shapes "
            f"{tuple(q_t.shape)} and {tuple(k_t.shape)}"
        )
    dv = v_t.shape[-1]
    if length == 0 and values.shape[-1] != dv:
        values = values.new_zeros(b, h, w, dv)
    if v_t.shape != (b, h, 1, values.shape[-1]):
        raise ValueError(
            f"v_t must be (B, H, 1, Dv) = {(b, h, 1, values.shape[-1])} for this state, got "
            "shape "
            f"{tuple(v_t.shape)}"
        )
    return keys, values, length
