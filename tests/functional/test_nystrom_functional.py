"""The Nyström family's functions in kattn.functional: Skyformer's landmarks and its attention
against the explicit reference, Nyströmformer's convolution skip against its banded matrix."""

import pytest
import torch

import kattn
from kattn.functional import (
    nystromformer_conv_skip,
    nystromformer_conv_skip_reference,
    skyformer_attention,
    skyformer_attention_reference,
    skyformer_landmarks,
)

from ..helpers import assert_close, grads, padding_mask, qkv


def uniforms(b, sq, sk, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, sq, generator=g), torch.rand(b, sk, generator=g)


CASES = {  # (Lq, Lk, pads per batch row or None, landmarks per side or None for every row)
    "self": (29, 29, None, 6),
    "self-padded": (29, 29, (0, 7), 6),
    "cross-padded": (13, 22, (4, 0), 5),
    "every-row": (7, 9, (2, 0), None),
    "a-row-all-padding": (11, 11, (0, 11), 4),
}


@pytest.mark.parametrize("iterations", [6, None], ids=["pinv6", "exact-inverse"])
@pytest.mark.parametrize("case", list(CASES))
def test_skyformer_attention_equals_its_reference(case, iterations):
    lq, lk, pads, count = CASES[case]
    q, k, v = qkv(2, 3, lq, lk, d=8, dv=5, requires_grad=True)
    mask = None if pads is None else padding_mask(2, lk, pads)
    draws = None if count is None else uniforms(2, count, count)
    index, ok = skyformer_landmarks(2, lq, lk, draws, key_padding_mask=mask)
    options = {
        "landmark_mask": None if mask is None else ok,
        "key_padding_mask": mask,
        "gamma": 0.1,
        "iterations": iterations,
    }
    out = skyformer_attention(q, k, v, index, **options)
    ref = skyformer_attention_reference(q, k, v, index, **options)
    assert out.shape == (2, 3, lq, 5)
    assert_close(out, ref)
    for fast, slow in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(fast, slow)


@pytest.mark.parametrize("init", ["identity", "per_matrix", "global"])
def test_skyformer_reference_follows_the_pinv_start(init):
    q, k, v = qkv(2, 2, 19, d=8, dv=4)
    index, _ = skyformer_landmarks(2, 19, 19, uniforms(2, 5, 5))
    out = skyformer_attention(q, k, v, index, init=init)
    assert_close(out, skyformer_attention_reference(q, k, v, index, init=init))


def test_every_row_is_a_landmark_without_uniforms():
    mask = padding_mask(2, 6, (0, 2))
    index, ok = skyformer_landmarks(2, 4, 6, None, key_padding_mask=mask)
    assert torch.equal(index, torch.arange(10).expand(2, -1))
    # cross-attention: the queries are all valid; the padded keys are not
    assert torch.equal(ok, torch.cat([torch.ones(2, 4, dtype=torch.bool), ~mask], dim=1))


def test_landmarks_are_drawn_among_the_allowed_rows_only():
    mask = padding_mask(3, 20, (0, 9, 17))
    index, ok = skyformer_landmarks(3, 20, 20, uniforms(3, 30, 30), key_padding_mask=mask)
    assert ok.all()  # every drawn row is a non-padded query or key
    queries, keys = index[:, :30], index[:, 30:] - 20
    assert (queries >= 0).all() and (queries < 20).all() and (keys >= 0).all()
    allowed = ~mask
    assert allowed.gather(1, queries).all() and allowed.gather(1, keys).all()


def test_a_mask_that_allows_everything_draws_the_same_landmarks_as_no_mask():
    draws = uniforms(2, 7, 9)
    no_mask = skyformer_landmarks(2, 15, 15, draws)
    all_allowed = skyformer_landmarks(
        2, 15, 15, draws, key_padding_mask=torch.zeros(2, 15, dtype=torch.bool)
    )
    assert torch.equal(no_mask[0], all_allowed[0]) and torch.equal(no_mask[1], all_allowed[1])


def test_a_row_of_padding_only_draws_among_all_rows_and_marks_them_invalid():
    draws = uniforms(2, 4, 4)
    mask = padding_mask(2, 10, (0, 10))
    index, ok = skyformer_landmarks(2, 10, 10, draws, key_padding_mask=mask)
    assert torch.equal(index[1], skyformer_landmarks(2, 10, 10, draws)[0][1])
    assert ok[0].all() and not ok[1].any()


def test_the_module_uses_the_functions():
    attn = kattn.build("skyformer", head_dim=8, num_heads=2, num_landmarks=8).eval()
    q, k, v = qkv(2, 2, 21, d=8, dv=4)
    mask = padding_mask(2, 21, (3, 0))
    index, ok = attn.landmarks(2, 21, 21, mask, "cpu")
    options = {"landmark_mask": ok, "key_padding_mask": mask}
    assert torch.equal(
        attn(q, k, v, key_padding_mask=mask), skyformer_attention(q, k, v, index, **options)
    )
    assert torch.equal(
        attn.reference(q, k, v, key_padding_mask=mask),
        skyformer_attention_reference(q, k, v, index, **options),
    )


@pytest.mark.parametrize("size", [1, 3, 7, 35])
def test_conv_skip_equals_its_banded_matrix(size):
    _, _, v = qkv(2, 3, 12, dv=5, requires_grad=True)
    g = torch.Generator().manual_seed(size)
    weight = torch.randn(3, 1, size, 1, generator=g, dtype=torch.float64, requires_grad=True)
    out = nystromformer_conv_skip(v, weight)
    ref = nystromformer_conv_skip_reference(v, weight)
    assert out.shape == v.shape
    assert_close(out, ref)
    for fast, slow in zip(grads(out, v, weight), grads(ref, v, weight), strict=True):
        assert_close(fast, slow)


def test_conv_skip_sums_the_neighbours_with_the_filter_taps():
    v = torch.arange(5, dtype=torch.float64).reshape(1, 1, 5, 1)  # values 0 … 4
    weight = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64).reshape(1, 1, 3, 1)
    out = nystromformer_conv_skip(v, weight)[0, 0, :, 0]
    # skip_i = v_{i−1} + 10 v_i + 100 v_{i+1}, zero beyond the ends
    expected = torch.tensor([100.0, 210.0, 321.0, 432.0, 43.0], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("lq", [1, 3])
def test_nystromformer_with_fewer_queries_than_landmarks(lq):
    """Cross-attention with fewer queries than landmarks (a decoding step over many keys):
    both sides take min(m, Lq, Lk) landmarks, so the middle kernel is square; the fast path
    equals the explicit reference, forward and gradients, padded keys included."""
    attn = kattn.build("nystromformer", head_dim=16, num_heads=3, max_len=64, num_landmarks=4)
    attn = attn.double()
    q, k, v = qkv(lq=lq, lk=48, requires_grad=True)
    mask = padding_mask(2, 48, (0, 5))
    out = attn(q, k, v, key_padding_mask=mask)
    assert out.shape == (2, 3, lq, 8) and out.isfinite().all()
    expected = attn.reference(q, k, v, key_padding_mask=mask)
    assert_close(out, expected)
    for got, want in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        assert_close(got, want)
