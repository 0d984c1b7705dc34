"""Angular LSH and the sorted orders of the Reformer (Kitaev, Kaiser and Levskaya, "Reformer:
The Efficient Transformer", ICLR 2020, §2, after Andoni et al. 2015): ``h(x) = argmax([xR;
−xR])`` for a random ``(D, nb/2)`` matrix R per round, the default number of buckets
``nb = 2·⌈l/m⌉`` for the longest length l, and each round's order by (bucket, position)
with padded positions last, both as a sort (the fast path) and as ranks counted pair by pair
(the dense reference). Used by :mod:`kattn.functional.reformer`.

Shapes: B batch, H heads, L length, D head dim, R rounds, nb buckets, Lp the length rounded up
to whole chunks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype, autocast_off

#: projections ``xR`` computed at once (positions are hashed in slices of this many; small
#: enough that a slice's passes stay in the cache).
_HASH_ELEMENTS = 1 << 18

__all__ = ["dense_rank", "lsh_buckets", "reformer_num_buckets", "slots", "sorted_order"]


def reformer_num_buckets(length: int, bucket_size: int) -> int:
    """``nb = 2·⌈L/m⌉`` buckets for L tokens and chunks of ``m = bucket_size`` (the paper's
    ``m = 2l/n_buckets``, rounded up to whole chunks; at least 2). Give it the longest length
    of the model (``max_len``), not each call's: a fixed nb keeps every token's bucket
    independent of the padding and of the later tokens."""
    return 2 * -(-positive_int("length", length) // positive_int("bucket_size", bucket_size))


def lsh_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH, ``h(x) = argmax([xR; −xR])`` (Kitaev et al. 2020, §2), for every round.

    Args:
        x: ``(B, H, L, D)``.
        rotations: ``(H or 1, D, R, nb/2)`` random projections, one set per head and round.

    Returns:
        ``(B, H, R, L)`` int64 buckets in ``[0, nb)``, computed in fp32 (fp64 for fp64 x);
        of tied maxima, the lowest rotation n wins, then xR before −xR.
    """
    if (
        rotations.ndim != 4
        or rotations.shape[0] not in (1, x.shape[1])
        or rotations.shape[1] != x.shape[-1]
    ):
        raise ValueError(
            f"rotations must be (H or 1, D, R, nb/2) with H = {x.shape[1]}, D = {x.shape[-1]}, "
            "got shape "
            f"{tuple(rotations.shape)}"
        )
    acc = accumulation_dtype(x.dtype)
    b, h, length, d = x.shape
    rounds, half = rotations.shape[2], rotations.shape[-1]
    buckets = torch.empty(b, h, length, rounds, dtype=torch.long, device=x.device)
    step = max(1, _HASH_ELEMENTS // max(1, b * h * rounds * half))
    with autocast_off(x), torch.no_grad():
        # (H or 1, D, R·nb/2): one product gives every round's projections in the layout
        # (B, H, L, R·nb/2), so no permuted copy of the projections is made
        rot = rotations.to(device=x.device, dtype=acc).reshape(-1, d, rounds * half)
        # the first n of the largest |xR_n| is the largest of (|xR_n| = max)·(nb/2 − n):
        # value reductions vectorise where index reductions (argmax) do not
        weight = torch.arange(half, 0, -1, device=x.device, dtype=acc)
        for start in range(0, length, step):  # xR a slice of positions at a time
            proj = torch.matmul(x[:, :, start : start + step].to(acc), rot)
            proj = proj.view(*proj.shape[:-1], rounds, half)
            top = proj.abs()
            top.eq_(top.amax(dim=-1, keepdim=True)).mul_(weight)
            arg = (half - top.amax(dim=-1).long()).clamp_(0, half - 1)  # NaN rows: n = nb/2 − 1
            # the bucket of the largest |xR_n|: n, or n + nb/2 when xR_n < 0 (argmax([xR; −xR])
            # but for ties, which go to the lowest n, then xR before −xR)
            negative = proj.gather(-1, arg[..., None]).squeeze(-1) < 0
            buckets[:, :, start : start + step] = torch.where(negative, arg + half, arg)
    return buckets.transpose(-1, -2)


def sorted_order(hashes: Tensor, pad: Tensor, lp: int) -> Tensor:
    """The positions of each round in (bucket, position) order with the padded positions
    last (in position order), ``(B, H, R, Lp)``,
    followed by ``Lp − L`` filler slots holding 0 (masked as padding wherever they are read)."""
    b, h, rounds, length = hashes.shape
    nb_top = int(hashes.max()) + 1 if hashes.numel() else 1
    bucket = torch.where(pad[:, None, None, :], nb_top, hashes)  # padding: a last bucket
    key = bucket * length + torch.arange(length, device=hashes.device)
    order = key.argsort(dim=-1)
    filler = order.new_zeros(b, h, rounds, lp - length)
    return torch.cat([order, filler], dim=-1)


def slots(order: Tensor, length: int) -> Tensor:
    """The inverse of :func:`sorted_order`: the sorted slot of each position, (B, H, R, L)."""
    slots = torch.empty_like(order[..., :length])
    ranks = torch.arange(length, device=order.device).expand_as(slots)
    return slots.scatter_(-1, order[..., :length], ranks)


def dense_rank(hashes: Tensor, pad: Tensor) -> Tensor:
    """Round by round, the number of positions before i in (padding, bucket, position) order
    (padded positions in position order, their buckets unused), counted pair by pair:
    ``(B, H, R, L)``. O(R·L²): for the reference."""
    length = hashes.shape[-1]
    padded = pad[:, None, None, :].expand_as(hashes)
    hashes = hashes.masked_fill(padded, 0)
    i = torch.arange(length, device=hashes.device)
    pi, pj = padded[..., :, None], padded[..., None, :]
    hi, hj = hashes[..., :, None], hashes[..., None, :]
    before = (pj < pi) | ((pj == pi) & ((hj < hi) | ((hj == hi) & (i[None, :] < i[:, None]))))
    return before.sum(dim=-1)
