"""Where each query's units lie against those of sums shared by a whole sequence.

Paths that sum every query in one set of units (the FFT of Luo et al. 2021, Algorithm 1:
the largest coefficient plus the largest key log-scale) measure the normaliser guard in a
bound on each query's own units, and recompute the causal queries far below the shared
units — a prefix, since both running maxima only grow — on that prefix alone, so that no
future key sets their guard or their round-off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .numerics import log_floor


def query_log_units(
    log_coeff: Tensor, s: Tensor | None, lq: int, lk: int, *, causal: bool
) -> Tensor:
    """``(B or 1, H, Lq)``: a bound from above on the largest weight ``b_{j−i} + s_j`` each
    query sees — its largest visible coefficient plus the largest key log-scale (causal: so
    far) — less the units of the FFT's sums (the largest coefficient in use plus the largest
    key log-scale), so ``<= 0``."""
    log_coeff = log_coeff.detach()
    if causal:  # offsets 0, −1, …, −i
        seen = log_coeff[:, :lq].flip(-1).cummax(dim=-1).values
    else:  # offsets −i…lk−1−i: a window of lk, starting at lq−1−i
        seen = sliding_max(log_coeff, lk).flip(-1)
    units = (seen - seen.amax(dim=-1, keepdim=True))[None]
    if s is not None and causal:
        units = units + running_key_units(s)
    return units


def running_key_units(s: Tensor) -> Tensor:
    """``(B, H, L)``: the largest key log-scale up to each position less the largest of all
    (<= 0; finite where only keys at the floor, padding, came before)."""
    s = s.detach()
    top = s.amax(dim=-1, keepdim=True)
    return (s.cummax(dim=-1).values - top).clamp_min(log_floor(s.dtype) / 2)


def sliding_max(x: Tensor, width: int) -> Tensor:
    """``(..., n − width + 1)``: the maxima of the windows ``x[..., t : t + width]`` in
    O(n), from running maxima within blocks of ``width`` (van Herk 1992; Gil & Werman 1993):
    a window spans at most two blocks."""
    n = x.shape[-1]
    blocks = -(-n // width)
    padded = F.pad(x, (0, blocks * width - n), value=log_floor(x.dtype))
    tiles = padded.unflatten(-1, (blocks, width))
    ahead = tiles.cummax(dim=-1).values.flatten(-2)  # block start … t
    behind = tiles.flip(-1).cummax(dim=-1).values.flip(-1).flatten(-2)  # t … block end
    starts = n - width + 1
    return torch.maximum(behind[..., :starts], ahead[..., width - 1 : width - 1 + starts])


def imprecise_prefix(units: Tensor, dtype: torch.dtype) -> tuple[Tensor, int]:
    """The causal queries whose units ``units (B or 1, H, L)`` (non-decreasing along L) lie
    more than a quarter of ``dtype``'s digits below the sums' (their round-off grows as
    ``exp(−units)``), and the length of the longest such prefix (one sync)."""
    below = units < -math.log(1.0 / torch.finfo(dtype).eps) / 4
    return below, int(below.sum(dim=-1).max())


def with_prefix(out: Tensor, below: Tensor, head: Tensor) -> Tensor:
    """``out`` with the queries ``below`` of its first ``p`` taken from ``head (B, H, p, ·)``."""
    p = head.shape[2]
    head = torch.where(below[:, :, :p, None], head, out[:, :, :p])
    return torch.cat([head, out[:, :, p:]], dim=2)
