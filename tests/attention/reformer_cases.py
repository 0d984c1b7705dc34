"""What the Reformer suites share: the head count, the four modes of the non-causal pattern
and seeded rotations for the paper's number of buckets."""

from __future__ import annotations

import torch

from kattn.functional import reformer_num_buckets

H = 2
MODES = {  # shared_qk, attend_across_buckets
    "shared": (True, True),
    "shared-same-bucket": (True, False),
    "separate": (False, True),
    "separate-same-bucket": (False, False),
}


def rotations(
    length: int,
    bucket_size: int,
    rounds: int,
    d: int = 16,
    seed: int = 1,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``(H, d, rounds, nb/2)`` N(0, 1) rotations for one hash of the paper's
    ``nb = 2·⌈L/m⌉`` buckets."""
    g = torch.Generator().manual_seed(seed)
    nb = reformer_num_buckets(length, bucket_size)
    return torch.randn(H, d, rounds, nb // 2, generator=g, dtype=dtype)
