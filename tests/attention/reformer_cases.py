"""What the Reformer suites share: the head count, the four modes of the non-causal pattern,
seeded rotations for the paper's number of buckets, and the comparison of the chunked pass
with the dense reference."""

from __future__ import annotations

import torch

from kattn.functional import (
    reformer_attention,
    reformer_attention_reference,
    reformer_chunks,
    reformer_num_buckets,
)

from ..helpers import assert_close, grads

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


def split_slices(monkeypatch) -> None:
    """One (batch, head) sequence per slice and one block per group, so that the chunked
    pass meets slice and group boundaries everywhere."""
    monkeypatch.setattr(reformer_chunks, "_SLICE_ROWS", 1)
    monkeypatch.setattr(reformer_chunks, "_CHUNK_ELEMENTS", 1)


def assert_matches_reference(q, k, v, rot, **options) -> torch.Tensor:
    """The chunked pass equals the dense reference, output and the gradients of q, v and
    (unless shared QK, where k is not read) k; returns the chunked output."""
    out = reformer_attention(q, k, v, rot, **options)
    ref = reformer_attention_reference(q, k, v, rot, **options)
    assert_close(out, ref)
    inputs = (q, v) if options.get("shared_qk", True) else (q, k, v)
    for got, want in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(got, want)
    return out
