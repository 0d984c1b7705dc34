"""Which key slots each query slot of Reformer LSH attention may read (Kitaev, Kaiser and
Levskaya, "Reformer: The Efficient Transformer", ICLR 2020, §2 and App. A): the non-causal
chunks of the sorted order (:class:`ChunkRules`, applied per group of blocks from per-slot
values) and kattn's causal same-bucket window (:func:`causal_key_ranges`,
:func:`causal_layout`, a bool per score in :class:`DenseRules`), each key counted in one round
only. Used by :func:`kattn.functional.reformer_attention` with
:class:`kattn.functional.reformer_chunks.ChunkPlan`.

Shapes: B batch, H heads, L length, R rounds, m the chunk length, nc = ⌈L/m⌉ chunks per
round, Lp = nc·m.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .lsh import slots

__all__ = ["MASKED", "ChunkRules", "DenseRules", "causal_key_ranges", "causal_layout"]


#: the logit of a disallowed key: exp(−1e30 − max) is 0 in fp32 and fp64; a row whose largest
#: logit is below half of it reads no key.
MASKED = -1e30


class DenseRules:
    """Which key slots each query slot may read as one bool per score (kattn's causal form,
    :func:`causal_layout`): ``allowed (B, H, R, NB, m, S)``, applied by ``masked_fill``.

    Attributes:
        blocked: ``(R, B·H·NB, m, S)``, True where a query slot may not read a key slot.
        positioned: ``(R, B·H·NB·m)``, the query slots whose output goes back to a position
            (not the filler slots, nor those that read no key: their positions get a zero row).
    """

    def __init__(self, allowed: Tensor) -> None:
        b, h, rounds, nblocks, m, span = allowed.shape
        self.per_sequence, self.window = nblocks, span  # key slots per block
        allowed = allowed.movedim(2, 0)
        blocked = torch.empty(allowed.shape, dtype=torch.bool, device=allowed.device)
        torch.logical_not(allowed, out=blocked)  # in round-major order
        self.blocked = blocked.view(rounds, b * h * nblocks, m, span)
        # a value reduction over the bytes: any() over the last dim of a bool tensor does not
        # vectorise
        self.positioned = allowed.view(torch.uint8).amax(dim=-1).reshape(rounds, -1).bool()

    def at(self, r: int, s0: int, s1: int) -> _DenseSlice:
        """Round r's rules for the (batch, head) sequences s0..s1."""
        n = self.per_sequence
        return _DenseSlice(self.blocked[r, s0 * n : s1 * n])


class _DenseSlice:
    def __init__(self, blocked: Tensor) -> None:
        self.blocked = blocked
        #: a slot reads nothing where its row is all False (no other rule)
        self.reads: Tensor | None = None

    def apply(self, scores: Tensor, c0: int, c1: int, scratch: Tensor) -> None:
        """Set the disallowed logits of the slice's blocks c0..c1 to :data:`MASKED`."""
        scores.masked_fill_(self.blocked[c0:c1], MASKED)


class ChunkRules:
    """The non-causal form's rules, per slot instead of per score: query slot s of round r,
    in chunk n of the sorted order, may read the key slots of chunks n − 1 and n (none before
    the first chunk) except

    - padded keys and filler slots;
    - itself: with keys sorted as the queries (shared QK) the own chunk's diagonal, otherwise
      the key slot holding the query's position;
    - unless ``across``, keys of another bucket;
    - keys that an earlier round e < r already holds for the query (each key counts once):
      those whose round-e chunk is the query's round-e chunk or the one before it (and, unless
      ``across``, whose round-e bucket is the query's);

    and padded queries and filler slots read nothing. Each group of blocks gets these as
    :data:`MASKED` logits (:meth:`_ChunkSlice.apply`): the earlier-round test is float
    arithmetic on the chunk numbers (exact below 2^24), which vectorises where a bool mask of
    the scores does not.

    Args:
        order_q, order_k: ``(B, H, R, Lp)``, the positions in sorted order (filler slots
            after the L positions); ``order_k is order_q`` for shared QK.
        hashes_q, hashes_k: ``(B, H, R, L)`` buckets.
        pad: ``(B, L)`` bool, True marks padding.
        m: the chunk length.
        across: whether keys of another bucket in the two chunks count.
        dtype: the dtype of the logits.
    """

    def __init__(
        self,
        order_q: Tensor,
        order_k: Tensor,
        hashes_q: Tensor,
        hashes_k: Tensor,
        pad: Tensor,
        m: int,
        across: bool,
        dtype: torch.dtype,
    ) -> None:
        b, h, rounds, lp = order_q.shape
        length = hashes_q.shape[-1]
        self.m, self.lp, self.across = m, lp, across
        self.window = 2 * m  # key slots per block: the chunk before and the own chunk
        self.shared = order_k is order_q
        device = order_q.device

        def flat(x: Tensor) -> Tensor:  # (B, H, R, Lp) → (R, B·H·Lp)
            return x.expand(b, h, rounds, lp).movedim(2, 0).reshape(rounds, -1)

        slot = torch.arange(lp, device=device)
        self.positioned = flat(slot < length)  # every slot but the fillers has a position
        self.key_bias: Tensor | None = None  # MASKED at padded and filler key slots, else 0
        self.reads: Tensor | None = None  # False at padded and filler query slots
        if lp > length or bool(pad.any()):
            closed = pad[:, None, None, :].expand(b, h, rounds, length).gather(3, order_k)
            closed[..., length:] = True
            self.key_bias = flat(closed).to(dtype).mul_(MASKED)
            real = length - pad.sum(dim=-1, keepdim=True)  # (B, 1): real queries come first
            self.reads = flat((slot < real)[:, None, None, :])
        if not self.shared:
            self.pos_q, self.pos_k = flat(order_q), flat(order_k)
        if not across:  # each slot's bucket in its round
            self.bucket_q = flat(hashes_q.gather(-1, order_q))
            self.bucket_k = flat(hashes_k.gather(-1, order_k))
        # for round r and each e < r: the round-e chunk of the query (key) at each slot of
        # round r, as floats (keys shifted by one half) and, unless across, its round-e bucket
        chunk_q, chunk_k = slots(order_q, length) // m, slots(order_k, length) // m
        self.earlier: dict[int, list[_Earlier]] = {r: [] for r in range(rounds)}
        for r in range(1, rounds):
            pq, pk = order_q[:, :, r], order_k[:, :, r]  # (B, H, Lp)
            for e in range(r):
                buckets = None
                if not across:
                    buckets = (hashes_q[:, :, e].gather(-1, pq), hashes_k[:, :, e].gather(-1, pk))
                held = _Earlier(
                    chunk_q[:, :, e].gather(-1, pq).to(dtype).flatten(),
                    chunk_k[:, :, e].gather(-1, pk).to(dtype).flatten().add_(0.5),
                    None if buckets is None else (buckets[0].flatten(), buckets[1].flatten()),
                )
                self.earlier[r].append(held)

    def at(self, r: int, s0: int, s1: int) -> _ChunkSlice:
        """Round r's rules for the (batch, head) sequences s0..s1."""
        return _ChunkSlice(self, r, s0, s1)


class _ChunkSlice:
    """:class:`ChunkRules` of one round for a slice of sequences, whose keys follow one
    front chunk (as :class:`kattn.functional.reformer_chunks.ChunkPlan` lays them out)."""

    def __init__(self, rules: ChunkRules, r: int, s0: int, s1: int) -> None:
        m, lp = rules.m, rules.lp
        rows = slice(s0 * lp, s1 * lp)
        self.m, self.nblocks, self.shared = m, lp // m, rules.shared
        self.reads = None if rules.reads is None else rules.reads[r, rows]

        def keys(x: Tensor) -> Tensor:  # the slice's key-slot values after the front chunk
            return torch.cat([x.new_zeros(m), x[rows]])

        self.key_bias = None if rules.key_bias is None else keys(rules.key_bias[r])
        self.pos = None if rules.shared else (rules.pos_q[r, rows], keys(rules.pos_k[r]))
        self.bucket = None if rules.across else (rules.bucket_q[r, rows], keys(rules.bucket_k[r]))
        self.earlier = [
            _Earlier(
                held.query_chunk[rows],
                keys(held.key_chunk),
                None if held.buckets is None else (held.buckets[0][rows], keys(held.buckets[1])),
            )
            for held in rules.earlier[r]
        ]

    def _window(self, x: Tensor, c0: int, c1: int) -> Tensor:
        """The key-slot values of blocks c0..c1's windows, ``(c, 1, 2m)``."""
        m = self.m
        return x[c0 * m :].as_strided((c1 - c0, 1, 2 * m), (m, 0, 1))

    def _queries(self, x: Tensor, c0: int, c1: int) -> Tensor:
        """The query-slot values of blocks c0..c1, ``(c, m, 1)``."""
        return x[c0 * self.m : c1 * self.m].view(c1 - c0, self.m, 1)

    def apply(self, scores: Tensor, c0: int, c1: int, scratch: Tensor) -> None:
        """Set the disallowed logits of the slice's blocks c0..c1, ``scores (c, m, 2m)``, to
        :data:`MASKED` or below (``scratch``: a buffer of at least the scores' size)."""
        m, c = self.m, c1 - c0
        # the first block of each sequence has no chunk before it
        scores[(-c0) % self.nblocks :: self.nblocks, :, :m] = MASKED
        if self.key_bias is not None:
            scores.add_(self._window(self.key_bias, c0, c1))
        if self.pos is None:  # keys sorted as the queries: its own slot is the diagonal
            scores[:, :, m:].diagonal(dim1=-2, dim2=-1).fill_(MASKED)
        else:
            pos_q, pos_k = self.pos
            own = self._window(pos_k, c0, c1) == self._queries(pos_q, c0, c1)
            scores.masked_fill_(own, MASKED)
        if self.bucket is not None:
            bucket_q, bucket_k = self.bucket
            other = self._window(bucket_k, c0, c1) != self._queries(bucket_q, c0, c1)
            scores.masked_fill_(other, MASKED)
        held = scratch.view(-1)[: scores.numel()].view(c, m, 2 * m)
        for earlier in self.earlier:  # each key once: drop what an earlier round holds
            # key chunk + ½ − query chunk is ±½ when the key's chunk is the query's or the one
            # before, else at least 3/2 in size: |·| − 3/2 is −1 there, clamped to 0 elsewhere
            key_chunk = self._window(earlier.key_chunk, c0, c1)
            torch.sub(key_chunk, self._queries(earlier.query_chunk, c0, c1), out=held)
            held.abs_().sub_(1.5).clamp_max_(0.0)
            if earlier.buckets is not None:  # and of the query's bucket in that round
                bucket_q, bucket_k = earlier.buckets
                held.mul_(self._window(bucket_k, c0, c1) == self._queries(bucket_q, c0, c1))
            scores.add_(held, alpha=-MASKED)


class _Earlier(NamedTuple):
    """For the slots of a round r and an earlier round e: the round-e chunk of each query,
    that of each key plus ½ (floats), and unless across their round-e buckets."""

    query_chunk: Tensor
    key_chunk: Tensor
    buckets: tuple[Tensor, Tensor] | None


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
