"""Which key slots each query slot of Reformer LSH attention may read (Kitaev, Kaiser and
Levskaya, "Reformer: The Efficient Transformer", ICLR 2020, §2 and App. A): the non-causal
chunks of the sorted order (:func:`chunk_mask`) and kattn's causal same-bucket window
(:func:`causal_key_ranges`, :func:`causal_layout`), each key counted in one round only. Used
by :func:`kattn.functional.reformer_attention` with
:class:`kattn.functional.reformer_chunks.ChunkPlan`.

Shapes: B batch, H heads, L length, R rounds, m the chunk length, nc = ⌈L/m⌉ chunks per
round, Lp = nc·m.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .lsh import slots

__all__ = ["causal_key_ranges", "causal_layout", "chunk_mask"]


def chunk_mask(
    order_q: Tensor,
    order_k: Tensor,
    hashes_q: Tensor,
    hashes_k: Tensor,
    pad: Tensor,
    m: int,
    across: bool,
) -> Tensor:
    """``(B, H, R·nc, m, 2m)`` bool, True where query slot s may read the key slot of
    ``[previous chunk, own chunk]`` (the non-causal form): not itself, the same bucket (unless
    ``across``) held by no earlier round (each key counts once), and neither a padded key nor
    a filler slot; padded and filler query slots read nothing. ``order_k is order_q``
    (shared QK) marks a query's own slot as the diagonal of its own chunk instead of comparing
    positions."""
    b, h, rounds, lp = order_q.shape
    length = hashes_q.shape[-1]
    nc = lp // m
    key_pad = pad[:, None, None, :].expand(b, h, rounds, length).gather(3, order_k)
    key_pad[..., length:] = True  # the filler slots
    key_pad = key_pad.view(b, h, rounds, nc, m)
    open_keys = torch.cat([key_pad.roll(1, dims=3), key_pad], dim=-1).logical_not_()
    open_keys[:, :, :, 0, :m] = False  # chunk 0 of a round has no previous chunk
    allowed = open_keys[..., None, :].expand(b, h, rounds, nc, m, 2 * m).clone()
    if order_k is order_q:  # each position holds one slot: its own is the own chunk's diagonal
        allowed[..., m:].diagonal(dim1=-2, dim2=-1).fill_(False)
    else:
        qpos = order_q.view(b, h, rounds, nc, m, 1)
        kpos = order_k.view(b, h, rounds, nc, m)
        allowed &= torch.cat([kpos.roll(1, dims=3), kpos], dim=-1)[..., None, :] != qpos
    # padded queries (sorted after the real ones) and filler slots read nothing
    real = length - pad.sum(dim=-1, keepdim=True)  # (B, 1): the real queries come first
    if lp > length or bool(pad.any()):  # else every slot is a real query's
        reading = torch.arange(lp, device=pad.device) < real  # (B, Lp)
        allowed.view(b, h, rounds, lp, 2 * m).logical_and_(reading[:, None, None, :, None])

    def at(table: Tensor, pos: Tensor) -> Tensor:  # table (B, H, R, L) read at positions
        return table.gather(-1, pos.reshape(b, h, 1, -1).expand(-1, -1, table.shape[2], -1))

    def window(x: Tensor) -> Tensor:  # (…, nc, m) per key slot → (…, nc, 1, 2m)
        return torch.cat([x.roll(1, dims=-2), x], dim=-1)[..., None, :]

    if not across:
        bq = at(hashes_q, order_q).view(b, h, rounds, rounds, nc, m, 1)
        bk = window(at(hashes_k, order_k).view(b, h, rounds, rounds, nc, m))
        for r in range(rounds):
            allowed[:, :, r] &= bq[:, :, r, r] == bk[:, :, r, r]
    if rounds > 1:
        # chunk numbers as small ints: the broadcast difference below vectorises
        small = torch.int16 if nc < 2**15 - 1 else torch.int32
        shape = (b, h, rounds, rounds, nc, m)
        cq = at(slots(order_q, length) // m, order_q).to(small).view(*shape, 1)
        ck = window(at(slots(order_k, length) // m, order_k).to(small).view(shape))
        for r in range(1, rounds):  # drop what rounds 0 … r − 1 already hold
            for e in range(r):
                # held in round e: the key's chunk there is the query's or the one before,
                # i.e. ck − cq + 1 ∈ {0, 1}, i.e. (ck − cq + 1) & ~1 = 0
                step = torch.sub(ck[:, :, e, r], cq[:, :, e, r]).add_(1).bitwise_and_(-2)
                held = step == 0
                if not across:
                    held &= bq[:, :, e, r] == bk[:, :, e, r]
                allowed[:, :, r] &= ~held
    return allowed.view(b, h, rounds * nc, m, 2 * m)


def causal_key_ranges(
    order_k: Tensor, hashes_q: Tensor, hashes_k: Tensor, pad: Tensor, window: int
) -> tuple[Tensor, Tensor]:
    """The causal form's keys of each query position i, round by round: the key slots
    ``[lo_i, hi_i)`` of the sorted order, ``hi_i`` the slot where (bucket h(q_i), position i)
    would be inserted among the real keys (so the slots before it in its bucket are exactly
    the keys ``j < i`` of that bucket) and ``lo_i = max(first slot of the bucket, hi_i −
    window)``: the ``window`` most recent earlier keys of the bucket. ``(B, H, R, L)`` each."""
    length = hashes_k.shape[-1]
    pos = torch.arange(length, device=hashes_k.device)
    top = int(torch.maximum(hashes_q.max(), hashes_k.max())) + 1 if hashes_k.numel() else 1
    key = torch.where(pad[:, None, None, :], top, hashes_k) * length + pos
    ordered = key.gather(-1, order_k[..., :length]).contiguous()  # ascending: real keys first
    hi = torch.searchsorted(ordered, (hashes_q * length + pos).contiguous())
    first = torch.searchsorted(ordered, (hashes_q * length).contiguous())
    return torch.maximum(first, hi - window), hi


def causal_layout(
    order_q: Tensor, order_k: Tensor, hashes_q: Tensor, hashes_k: Tensor, pad: Tensor, m: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The blocks of the causal form (window ``W = 2m − 1`` key slots): ``(query positions
    (B, H, R, NB·m), starts (B, H, R, NB), allowed (B, H, R, NB, m, 3m))`` for
    :class:`ChunkPlan` with a window of three key chunks.

    The real queries, in (bucket, position) order, have nondecreasing ``hi``; those with
    ``⌊hi/m⌋ = g`` need only key chunks g − 2 … g (``hi − W ≥ (g − 2)·m + 1``), so each
    such group is cut into blocks of m and its blocks read those three chunks. With shared
    QK, ``hi`` is the query's own slot and the blocks are the chunks of the sorted order;
    otherwise there are at most ``⌈L/m⌉ + nc + 1`` blocks. Padded queries read nothing.
    Keys held by an earlier round are dropped (each key counts once)."""
    b, h, rounds, length = hashes_q.shape
    nc = -(-length // m)
    lo, hi = causal_key_ranges(order_k, hashes_q, hashes_k, pad, 2 * m - 1)
    oq = order_q[..., :length]
    real = ~pad[:, None, None, :].expand(b, h, rounds, length).gather(-1, oq)
    group = torch.where(real, hi.gather(-1, oq) // m, nc + 1)  # nondecreasing; padding last
    counts = torch.zeros(b, h, rounds, nc + 2, dtype=torch.long, device=oq.device)
    counts.scatter_add_(-1, group, torch.ones_like(group))
    blocks = (counts + m - 1) // m
    blocks[..., -1] = 0  # the padded queries' group has no block
    nblocks = max(1, int(blocks.sum(-1).max()))
    rank = torch.arange(length, device=oq.device) - (counts.cumsum(-1) - counts).gather(-1, group)
    block = torch.where(real, (blocks.cumsum(-1) - blocks).gather(-1, group) + rank // m, nblocks)
    dest = torch.where(real, block * m + rank % m, nblocks * m)  # the last slot: a bin
    slots_shape = (b, h, rounds, nblocks * m + 1)
    qpos = oq.new_zeros(slots_shape).scatter_(-1, dest, oq)[..., :-1]
    valid = real.new_zeros(slots_shape).scatter_(-1, dest, real)[..., :-1]
    starts = group.new_zeros(b, h, rounds, nblocks + 1).scatter_(-1, block, group)[..., :-1]
    t = (starts[..., None] - 2) * m + torch.arange(3 * m, device=oq.device)  # (…, NB, 3m)
    lo_q = lo.gather(-1, qpos).view(b, h, rounds, nblocks, m, 1)
    hi_q = hi.gather(-1, qpos).view(b, h, rounds, nblocks, m, 1)
    allowed = (t[..., None, :] >= lo_q) & (t[..., None, :] < hi_q)
    allowed &= valid.view(b, h, rounds, nblocks, m, 1)
    if rounds > 1:
        keys = torch.cat([order_k.new_zeros(b, h, rounds, 2 * m), order_k], dim=-1)
        keys = torch.cat([keys, order_k.new_zeros(b, h, rounds, m)], dim=-1)
        kpos = keys.gather(-1, (t + 2 * m).clamp_max(keys.shape[-1] - 1).flatten(-2))
        ks = slots(order_k, length)
        for r in range(1, rounds):  # drop what rounds 0 … r − 1 already hold
            qr, kr = qpos[:, :, r], kpos[:, :, r]
            for e in range(r):
                ke = ks[:, :, e].gather(-1, kr).view(b, h, nblocks, 1, 3 * m)
                le = lo[:, :, e].gather(-1, qr).view(b, h, nblocks, m, 1)
                he = hi[:, :, e].gather(-1, qr).view(b, h, nblocks, m, 1)
                allowed[:, :, r] &= ~((ke >= le) & (ke < he))
    return qpos, starts, allowed
