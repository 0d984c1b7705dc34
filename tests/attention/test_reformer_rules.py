"""The non-causal Reformer rules applied per group of chunks from per-slot values
(:class:`kattn.functional.reformer_patterns.ChunkRules`): without padding or filler slots (no
key bias, every slot reads), in float32 over hundreds of chunks (the earlier-round test in
float arithmetic), and slots that read no key at all."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import (
    reformer_attention,
    reformer_attention_reference,
)
from kattn.functional.reformer_patterns import ChunkRules

from ..helpers import assert_close, qkv
from .reformer_cases import MODES, H, assert_matches_reference, split_slices
from .reformer_cases import rotations as _rotations


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("mode", list(MODES))
def test_whole_chunks_without_padding_equal_the_reference(mode, split, monkeypatch):
    """L = 64 in chunks of 4 (no filler slot), no padding, 3 rounds: forward and gradients."""
    if split:
        split_slices(monkeypatch)
    shared_qk, across = MODES[mode]
    q, k, v = qkv(3, H, 64, dv=5, requires_grad=True)
    rot = _rotations(64, 4, 3)
    kw = {"bucket_size": 4, "shared_qk": shared_qk, "attend_across_buckets": across}
    assert_matches_reference(q, k, v, rot, **kw)


def test_no_per_score_mask_is_built_for_whole_chunks_without_padding():
    order = torch.arange(64).repeat(1, H, 2, 1)  # (B, H, R, Lp)
    hashes = torch.zeros(1, H, 2, 64, dtype=torch.long)
    pad = torch.zeros(1, 64, dtype=torch.bool)
    rules = ChunkRules(order, order, hashes, hashes, pad, 4, True, torch.float32)
    assert rules.key_bias is None and rules.reads is None and bool(rules.positioned.all())
    largest = max(t.numel() for held in rules.earlier[1] for t in held[:2])
    assert largest == H * 64  # one value per slot, not one per score


@pytest.mark.parametrize("shared_qk", [True, False])
def test_float32_over_hundreds_of_chunks_equals_the_reference(shared_qk):
    """L = 1,024 in chunks of 2 (512 chunks a round), 2 rounds, float32: the earlier-round
    test on float chunk numbers keeps the reference's rule over many chunks in float32
    logits (its exactness holds below 2^24 chunks, far beyond what a test can run)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, H, 1024, 16, generator=g) for _ in range(3))
    rot = _rotations(1024, 2, 2, dtype=torch.float32)
    kw = {"bucket_size": 2, "shared_qk": shared_qk}
    out = reformer_attention(q, k, v, rot, **kw)
    ref = reformer_attention_reference(q, k, v, rot, **kw)
    assert_close(out, ref)


def test_a_slot_that_reads_no_key_reads_its_own_value():
    """Chunks of one position in one bucket: the first slot has no chunk before it and may
    not read itself; every other slot reads the one before it."""
    q, k, v = qkv(1, H, 6, requires_grad=True)
    rot = torch.zeros(H, 16, 1, 1, dtype=torch.float64)  # one bucket: position order
    out = assert_matches_reference(q, k, v, rot, bucket_size=1)
    assert_close(out[:, :, 0], v[:, :, 0])  # its own value
    assert_close(out[:, :, 1:], v[:, :, :-1])  # the one key it may read
