"""T5-style bucketed relative positions: exact near, log-spaced farther, constant beyond."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.banded import banded_linear_attention
from ..functional.banded_decoding import BandedState
from ..registry import check_option_types, register_encoding
from .base import RelativePositionBias, WindowDecoding


def t5_buckets(
    offsets: Tensor, *, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> Tensor:
    """Bucket of each offset ``j − i`` (Raffel et al., T5): offsets ``|n| < B/2`` (per
    direction) have their own bucket, larger ones share log-spaced buckets up to
    ``max_distance``, and everything beyond falls in the last bucket. With
    ``bidirectional=False`` every future offset shares bucket 0 with offset 0."""
    n = -offsets  # i − j: positive for earlier keys
    buckets = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp_min(0)
    max_exact = num_buckets // 2
    scaled = torch.log(n.clamp_min(1).double() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp_max(num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


class BucketedBias(WindowDecoding, RelativePositionBias):
    """``c_{j−i} = exp(b[bucket(j − i)])`` with T5 buckets; ``bias`` is ``(H, num_buckets)``,
    initialised to 0.

    The bias is constant beyond the last bucket boundary on each side, so the default
    ``"banded"`` method is exact and linear in L (a band plus far-field prefix sums), and
    decoding keeps a window of ``left`` tokens plus one linear-attention state: constant time
    per token. Other methods: ``"fft"``, ``"dense"``. No ``max_len`` needed.

    Args:
        num_buckets: buckets in all (split between past and future when ``bidirectional``).
        max_distance: offsets from here on share the last bucket of their side.
        bidirectional: separate buckets for future keys (False: they share offset 0's).
    """

    methods = ("banded", "fft", "dense")

    def __init__(
        self,
        *,
        num_heads: int,
        max_len: int | None = None,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        method: str | None = None,
    ):
        super().__init__(num_heads=num_heads, max_len=max_len, method=method)
        check_option_types(
            type(self).__name__, {"bidirectional": bidirectional}, {"bidirectional": bool}
        )
        is_int = isinstance(num_buckets, int) and not isinstance(num_buckets, bool)
        per_side = (num_buckets // 2 if bidirectional else num_buckets) if is_int else 0
        if per_side < 2:
            raise ValueError(
                f"num_buckets must be an int with at least 2 buckets per direction, "
                f"got {num_buckets!r} (bidirectional={bidirectional})"
            )
        if (
            isinstance(max_distance, bool)
            or not isinstance(max_distance, int)
            or max_distance <= per_side // 2
        ):
            raise ValueError(
                f"max_distance must be an int above the exact range {per_side // 2}, "
                f"got {max_distance!r}"
            )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.bias = nn.Parameter(torch.zeros(num_heads, num_buckets))
        # the band: offsets −left…right, constant beyond on each side
        reach = torch.arange(-(max_distance + 1), max_distance + 2)
        b = self.buckets(reach)
        self.left = _start_of_last_run(b[: max_distance + 1].flip(0))  # offsets −1, −2, ...
        self.right = _start_of_last_run(b[max_distance + 2 :])  # offsets 1, 2, ...
        self.band_buckets: Tensor
        self.register_buffer(
            "band_buckets", self.buckets(torch.arange(-self.left, self.right + 1)), persistent=False
        )

    def buckets(self, offsets: Tensor) -> Tensor:
        """The bucket of each offset ``j − i``."""
        return t5_buckets(
            offsets,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
        )

    def log_coefficients(self, lq: int, lk: int) -> Tensor:
        offsets = torch.arange(-(lq - 1), lk, device=self.bias.device)
        return self.bias[:, self.buckets(offsets)]

    def band_log_coefficients(self) -> Tensor:
        """``(H, left + right + 1)``: offsets ``−left…right``, the ends holding beyond."""
        return self.bias[:, self.band_buckets]

    def _attend_fast(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        return banded_linear_attention(
            phi_q, phi_k, v, self.band_log_coefficients(), self.left, **kwargs
        )

    def decoding_window(self, state: BandedState) -> tuple[Tensor, int]:
        return self.band_log_coefficients(), self.left

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}, "
            f"band=(-{self.left}, {self.right})"
        )


def _start_of_last_run(values: Tensor) -> int:
    """1 + the index where the final run of equal values starts (offsets count from 1)."""
    differs = (values != values[-1]).nonzero()
    return 1 if differs.numel() == 0 else int(differs[-1]) + 2


register_encoding("bucketed", BucketedBias)
