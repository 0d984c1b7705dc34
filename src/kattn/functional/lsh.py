"""Angular LSH and the sorted orders of the Reformer (Kitaev, Kaiser and Levskaya, "Reformer:
The Efficient Transformer", ICLR 2020, §2, after Andoni et al. 2015): ``h(x) = argmax([xR;
−xR])`` for a random ``(D, nb/2)`` matrix R per round, the default number of buckets
``nb = 2·⌈l/m⌉`` for the longest length l, and each round's order by (bucket, position)
with padded positions last, both as a sort (the fast path) and as ranks counted pair by pair
(the dense reference). Used by :mod:`kattn.functional.reformer`.

Factorized buckets (the authors' trax ``LSHSelfAttention``, whose ``n_buckets`` may be a list,
and Hugging Face ``transformers``' ``ReformerConfig.num_buckets``): ``nb = f_1·f_2·…``
buckets from one angular hash per factor, ``h(x) = Σ_i h_i(x)·f_1⋯f_{i−1}`` with ``h_i`` the
argmax over factor i's own ``f_i/2`` columns of R, so R has ``Σ f_i/2`` columns instead of
``nb/2``: two tokens share a bucket when they share every factor's bucket. Hugging Face
factorizes the automatic count into two when it exceeds ``2·max(⌊√(l/m)⌋, m)``
(:func:`reformer_bucket_factors`); at 16K tokens and m = 64 that is 16·32 buckets from 24
columns per round instead of 256.

Shapes: B batch, H heads, L length, D head dim, R rounds, nb buckets, Lp the length rounded up
to whole chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype, autocast_off

#: projections ``xR`` computed at once (positions are hashed in slices of this many; small
#: enough that a slice's passes stay in the cache).
_HASH_ELEMENTS = 1 << 19

__all__ = [
    "bucket_factors",
    "dense_rank",
    "lsh_buckets",
    "reformer_bucket_factors",
    "reformer_num_buckets",
    "slots",
    "sorted_order",
]


def reformer_num_buckets(length: int, bucket_size: int) -> int:
    """``nb = 2·⌈L/m⌉`` buckets for L tokens and chunks of ``m = bucket_size`` (the paper's
    ``m = 2l/n_buckets``, rounded up to whole chunks; at least 2). Give it the longest length
    of the model (``max_len``), not each call's: a fixed nb keeps every token's bucket
    independent of the padding and of the later tokens."""
    return 2 * -(-positive_int("length", length) // positive_int("bucket_size", bucket_size))


def reformer_bucket_factors(length: int, bucket_size: int) -> tuple[int, ...]:
    """The default buckets per round for L tokens and chunks of m: ``nb =``
    :func:`reformer_num_buckets`, hashed as one factor ``(nb,)`` up to Hugging Face's limit
    ``2·max(⌊√⌈L/m⌉⌋, m)`` and as two factors beyond it (module docstring): the most balanced
    ``(f_1, f_2)``, both even, ``f_1·f_2 = nb`` and ``f_1 ≤ f_2 ≤ 4·f_1``; where no such pair
    exists, ``f = 2·⌈⌈√nb⌉/2⌉`` and ``2·⌈nb/(2f)⌉`` in ascending order (at least nb
    buckets). Powers of two split as Hugging Face splits them: 512 → (16, 32)."""
    nb = reformer_num_buckets(length, bucket_size)
    if nb <= 2 * max(math.isqrt(nb // 2), bucket_size):  # nb // 2 = ⌈L/m⌉
        return (nb,)
    for f1 in range(2 * math.isqrt(nb // 4), 1, -2):  # the largest even f1 ≤ √nb first
        f2, rest = divmod(nb, f1)
        if rest == 0 and f2 % 2 == 0 and f2 <= 4 * f1:
            return (f1, f2)
    root = math.isqrt(nb - 1) + 1  # ⌈√nb⌉
    f1 = root + root % 2
    f2 = 2 * -(-nb // (2 * f1))
    return (min(f1, f2), max(f1, f2))


def bucket_factors(
    value: int | Sequence[int], rotation_columns: int | None = None
) -> tuple[int, ...]:
    """``value`` (nb, or the factors of nb) as a tuple of even ints >= 2, checked against the
    ``rotation_columns`` of R when given (``Σ f_i/2`` must equal it); ValueError otherwise."""
    items = (value,) if isinstance(value, int) else tuple(value)
    if not items or not all(
        isinstance(f, int) and not isinstance(f, bool) and f >= 2 and f % 2 == 0 for f in items
    ):
        raise ValueError(
            f"buckets must be an even int >= 2 or a non-empty list of them, got {value!r}"
        )
    if rotation_columns is not None and sum(items) // 2 != rotation_columns:
        raise ValueError(
            f"buckets {items} need rotations with {sum(items) // 2} columns per round "
            f"(Σ f/2), got {rotation_columns}"
        )
    return items


def lsh_buckets(x: Tensor, rotations: Tensor, factors: int | Sequence[int] | None = None) -> Tensor:
    """Angular LSH, ``h(x) = argmax([xR; −xR])`` (Kitaev et al. 2020, §2), for every round,
    one hash per factor of the number of buckets (module docstring).

    Args:
        x: ``(B, H, L, D)``.
        rotations: ``(H or 1, D, R, Σ f_i/2)`` random projections, one set per head and round:
            factor i's columns follow factor i − 1's.
        factors: the factors ``f_i`` of nb, each even; None: one, ``nb = 2·R.shape[-1]``.

    Returns:
        ``(B, H, R, L)`` int64 buckets in ``[0, nb)``, ``Σ h_i·f_1⋯f_{i−1}``, computed in fp32
        (fp64 for fp64 x); of tied maxima, the lowest rotation n wins, then xR before −xR.
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
    rounds, columns = rotations.shape[2], rotations.shape[-1]
    sizes = bucket_factors(2 * columns if factors is None else factors, columns)
    buckets = torch.empty(b, h, rounds, length, dtype=torch.long, device=x.device)
    step = max(1, _HASH_ELEMENTS // max(1, b * h * rounds * columns))
    with autocast_off(x), torch.no_grad():
        # (H or 1, R·Σf/2, D): one product gives every round's projections with the positions
        # last, (B, H, R·Σf/2, L), so that the reductions over a factor's columns are
        # elementwise over positions (they vectorise; along a short last dim they do not)
        rot = rotations.to(device=x.device, dtype=acc).reshape(-1, d, rounds * columns).mT
        for start in range(0, length, step):  # xR a slice of positions at a time
            proj = torch.matmul(rot, x[:, :, start : start + step].to(acc).mT)
            proj = proj.view(b, h, rounds, columns, -1)
            out = buckets[..., start : start + step]
            first, stride = 0, 1
            for f in sizes:  # factor i's bucket, weighted by the factors before it
                part = _signed_argmax(proj[:, :, :, first : first + f // 2])
                if stride == 1:
                    out.copy_(part)
                else:
                    out.add_(part, alpha=stride)
                first, stride = first + f // 2, stride * f
    return buckets


def _signed_argmax(proj: Tensor) -> Tensor:
    """``argmax([xR; −xR])`` over dim −2 of ``proj = xR`` (n columns, positions last), in
    ``[0, 2n)``: of tied maxima, the lowest column wins, then xR before −xR; a position whose
    projections hold a NaN gives n − 1."""
    half = proj.shape[-2]
    # the first n of the largest |xR_n| is the largest of (|xR_n| = max)·(n_cols − n): value
    # reductions vectorise where index reductions (argmax) do not
    weight = torch.arange(half, 0, -1, device=proj.device, dtype=proj.dtype)[:, None]
    top = proj.abs()
    top.eq_(top.amax(dim=-2, keepdim=True)).mul_(weight)
    arg = (half - top.amax(dim=-2).long()).clamp_(0, half - 1)
    # the bucket of the largest |xR_n|: n, or n + half when xR_n < 0
    negative = proj.gather(-2, arg.unsqueeze(-2)).squeeze(-2) < 0
    return torch.where(negative, arg + half, arg)


def sorted_order(hashes: Tensor, pad: Tensor, lp: int) -> Tensor:
    """The positions of each round in (bucket, position) order with the padded positions
    last (in position order), ``(B, H, R, Lp)``,
    followed by ``Lp − L`` filler slots holding 0 (masked as padding wherever they are read)."""
    b, h, rounds, length = hashes.shape
    nb_top = int(hashes.max()) + 1 if hashes.numel() else 1
    bucket = torch.where(pad[:, None, None, :], nb_top, hashes)  # padding: a last bucket
    device = hashes.device
    key = bucket * length + torch.arange(length, device=device)
    # one sort of every row's keys, each row offset past the one before (a flat sort runs in
    # parallel where a sort along the last dim of a few long rows does not)
    row = torch.arange(b * h * rounds, device=device).view(b, h, rounds, 1)
    key += row * ((nb_top + 1) * length)
    order = key.flatten().argsort().view(b, h, rounds, length) - row * length
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
