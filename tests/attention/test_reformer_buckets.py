"""Reformer's factorized buckets (trax's hierarchical hashing, Hugging Face's list
``num_buckets``): one angular hash per factor combined into one bucket, the default count
factorized beyond Hugging Face's limit, the option's forms and checks, and the chunked path
against its reference on factorized buckets."""

from __future__ import annotations

import math

import pytest
import torch

import kattn
from kattn.functional import (
    lsh_buckets,
    reformer_attention,
    reformer_bucket_factors,
    reformer_num_buckets,
)

from ..helpers import assert_close, grads, padding_mask, qkv
from .reformer_cases import assert_matches_reference

H = 2


def _signed_argmax(proj: torch.Tensor) -> torch.Tensor:
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def test_a_factorized_hash_combines_one_hash_per_factor():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, H, 200, 16, generator=g, dtype=torch.float64)
    factors = (4, 6, 2)  # 48 buckets from 2 + 3 + 1 columns per round
    rot = torch.randn(H, 16, 3, 6, generator=g, dtype=torch.float64)
    proj = torch.einsum("bhld,hdrn->bhrln", x, rot)
    h1, h2, h3 = (_signed_argmax(proj[..., a:b]) for a, b in ((0, 2), (2, 5), (5, 6)))
    expected = h1 + 4 * h2 + 24 * h3  # Σ h_i·f_1⋯f_{i−1}
    got = lsh_buckets(x, rot, factors)
    assert torch.equal(got, expected)
    assert got.min() >= 0 and got.max() < math.prod(factors)
    assert got.unique().numel() > 24  # every factor contributes
    assert torch.equal(lsh_buckets(x, rot[..., :2], [4]), h1)  # one factor: the plain hash
    assert torch.equal(lsh_buckets(x, rot), _signed_argmax(proj))  # None: one hash of 12


@pytest.mark.parametrize("factors", [(4, 4), (3, 6), (), (4, 0)])
def test_factors_that_do_not_match_the_rotations_are_refused(factors):
    x = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    rot = torch.randn(1, 4, 1, 5, dtype=torch.float64)  # 5 columns
    with pytest.raises(ValueError, match="buckets"):
        lsh_buckets(x, rot, factors)


def test_the_default_count_is_factorized_beyond_the_limit_as_hugging_face_does():
    # up to 2·max(⌊√⌈L/m⌉⌋, m) buckets one hash; LRA's longest input (4K) stays one hash
    assert reformer_bucket_factors(4096, 64) == (128,)
    assert reformer_bucket_factors(1000, 64) == (32,)
    for power in range(13, 21):  # powers of two: HF's [2^(p//2), 2^(p − p//2)], p = log2 nb
        p = int(math.log2(2 * 2**power // 64))
        assert reformer_bucket_factors(2**power, 64) == (2 ** (p // 2), 2 ** (p - p // 2))
    assert reformer_bucket_factors(16384, 64) == (16, 32)
    for length, m in [(4097, 64), (16000, 64), (70, 8), (70, 4), (99_999, 32), (5000, 2)]:
        factors, nb = reformer_bucket_factors(length, m), reformer_num_buckets(length, m)
        assert len(factors) == 2 and all(f % 2 == 0 and f >= 2 for f in factors)
        assert factors[0] <= factors[1] <= 4 * factors[0]  # balanced
        assert nb <= math.prod(factors) <= nb * 1.5  # at least the paper's count
    assert reformer_bucket_factors(16000, 64) == (22, 24)  # 500 has no balanced even pair


def test_the_module_takes_factors_as_a_list_a_tuple_or_a_string():
    for value in ([4, 6], (4, 6), "4,6"):
        attn = kattn.build("reformer", head_dim=16, num_heads=H, num_buckets=value)
        assert attn.bucket_factors(50) == (4, 6) and attn.buckets(50) == 24
        assert attn.rotations(50).shape == (H, 16, 2, 5)
    one = kattn.build("reformer", head_dim=16, num_heads=H, num_buckets=10)
    assert one.bucket_factors(50) == (10,) and one.rotations(50).shape == (H, 16, 2, 5)
    # the default: factorized from max_len (or the call's length) beyond the limit
    long = kattn.build("reformer", head_dim=16, num_heads=H, max_len=16384)
    assert long.bucket_factors(10) == (16, 32) and long.rotations(10).shape == (H, 16, 2, 24)
    assert "num_buckets=(4, 6)" in repr(
        kattn.build("reformer", head_dim=16, num_heads=H, num_buckets="4,6")
    )


@pytest.mark.parametrize("value", [[4, 5], [], [0, 4], "4,x", 7, 0, [True, 4], 4.0, [[4]]])
def test_invalid_bucket_counts_are_refused_with_a_sentence(value):
    with pytest.raises((ValueError, TypeError), match="num_buckets"):
        kattn.build("reformer", head_dim=16, num_heads=H, num_buckets=value)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shared_qk", [True, False])
def test_the_chunked_path_equals_the_reference_on_factorized_buckets(causal, shared_qk):
    g = torch.Generator().manual_seed(3)
    factors = (4, 6)
    rot = torch.randn(H, 16, 2, 5, generator=g, dtype=torch.float64)
    q, k, v = qkv(2, H, 61, requires_grad=True)
    kw = {
        "bucket_size": 4,
        "causal": causal,
        "shared_qk": shared_qk,
        "key_padding_mask": padding_mask(2, 61, (0, 7)),
        "bucket_factors": factors,
    }
    out = assert_matches_reference(q, k, v, rot, **kw)
    # the factors are the hash: the same rotations as one hash of 10 buckets differ
    assert not torch.allclose(
        out, reformer_attention(q, k, v, rot, **(kw | {"bucket_factors": None}))
    )


def test_the_module_on_default_factorized_buckets_equals_its_reference():
    attn = kattn.build("reformer", head_dim=16, num_heads=H, bucket_size=4).double().eval()
    q, k, v = qkv(1, H, 90, requires_grad=True)
    assert len(attn.bucket_factors(90)) == 2  # 2·⌈90/4⌉ = 46 > 2·max(4, 4)
    out, ref = attn(q, k, v), attn.reference(q, k, v)
    assert_close(out, ref)
    for got, want in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(got, want)
