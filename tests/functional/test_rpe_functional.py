"""Relative-position weighted linear attention: FFT, banded, decay and 2-D paths against the dense
``C ⊙ (φ(Q)φ(K)ᵀ)`` reference, forward and gradients."""

import pytest
import torch

from kattn.functional.banded import banded_linear_attention, banded_log_coefficients
from kattn.functional.banded_decoding import banded_init_state, banded_step
from kattn.functional.linear import linear_attention_reference
from kattn.functional.linear_causal import linear_attention_prefill
from kattn.functional.toeplitz import (
    circulant_embedding,
    clamp_to_value_range,
    fft_length,
    rpe_linear_attention_fft,
    toeplitz_dense,
    toeplitz_matmul,
)
from kattn.functional.toeplitz2d import rpe2d_linear_attention_fft, toeplitz2d_dense_log

from ..helpers import assert_close
from .rpe_helpers import (
    CASES,
    EPS,
    IDS,
    B,
    H,
    M,
    _seeded,
    check,
    inputs,
    mask_for,
    reference,
    run_steps,
)

__all__ = ["_seeded"]


@pytest.mark.parametrize(("lq", "lk", "causal"), CASES, ids=IDS)
@pytest.mark.parametrize("pads", [None, (3, 0)], ids=["no_pad", "pad"])
def test_fft_equals_dense_reference(lq, lk, causal, pads):
    fq, fk, v, s = inputs(lq, lk)
    log_c = torch.randn(H, lq + lk - 1, dtype=torch.float64).requires_grad_()
    mask = mask_for(lk, pads)
    out = rpe_linear_attention_fft(
        fq, fk, v, log_c, causal=causal, k_log_scale=s, key_padding_mask=mask, eps=EPS
    )
    coeff = toeplitz_dense(log_c.exp(), lq, lk)
    check(out, reference(fq, fk, v, s, coeff, causal=causal, mask=mask), fq, fk, v, s, log_c)


def test_fft_blocks_of_channels_give_the_same_result():
    fq, fk, v, s = inputs(19, 19)
    log_c = torch.randn(H, 37, dtype=torch.float64)
    whole = rpe_linear_attention_fft(fq, fk, v, log_c, k_log_scale=s, eps=EPS)
    blocked = rpe_linear_attention_fft(
        fq, fk, v, log_c, k_log_scale=s, max_block_elements=64, eps=EPS
    )
    check(blocked, whole, fq, fk, v, s)


def test_causal_fft_runs_in_float64_and_keeps_the_future_out():
    fq, fk, v, s = (x.detach().float() for x in inputs(33, 33, spread=4.0))
    log_c = torch.randn(H, 65)
    out = rpe_linear_attention_fft(fq, fk, v, log_c, causal=True, k_log_scale=s, eps=EPS)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[:, :, 20:], v2[:, :, 20:], s2[:, :, 20:] = 3.0, -7.0, 9.0
    out2 = rpe_linear_attention_fft(fq, fk2, v2, log_c, causal=True, k_log_scale=s2, eps=EPS)
    torch.testing.assert_close(out[:, :, :20], out2[:, :, :20], rtol=1e-6, atol=1e-7)


def test_toeplitz_matmul_and_circulant_embedding():
    g = torch.Generator().manual_seed(3)
    for lq, lk in [(1, 1), (5, 9), (9, 5), (16, 16)]:
        coeff = torch.randn(2, lq + lk - 1, generator=g, dtype=torch.float64)
        x = torch.randn(2, lk, generator=g, dtype=torch.float64)
        expected = (toeplitz_dense(coeff, lq, lk) @ x[..., None])[..., 0]
        assert_close(toeplitz_matmul(coeff, x, lq), expected)
    with pytest.raises(ValueError, match="offsets"):
        circulant_embedding(torch.zeros(4), 3, 3, 8)


def test_fft_length_is_smooth_and_large_enough():
    for n in [1, 2, 7, 31, 33, 97, 1000, 32767]:
        size = fft_length(n)
        assert size >= n and size < 2 * n + 1
        rest = size
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        assert rest == 1
    assert fft_length(32767) == 32768


@pytest.mark.parametrize(("lq", "lk", "causal"), CASES, ids=IDS)
@pytest.mark.parametrize(("left", "right"), [(1, 1), (3, 5), (9, 2)])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_banded_equals_dense_reference(lq, lk, causal, left, right, chunk):
    fq, fk, v, s = inputs(lq, lk, seed=left + right)
    log_c = torch.randn(H, left + right + 1, dtype=torch.float64).requires_grad_()
    mask = mask_for(lk, (2, 0))
    out = banded_linear_attention(
        fq,
        fk,
        v,
        log_c,
        left,
        causal=causal,
        k_log_scale=s,
        key_padding_mask=mask,
        chunk_size=chunk,
        block_size=8,
        eps=EPS,
    )
    coeff = toeplitz_dense(banded_log_coefficients(log_c, left, lq, lk).exp(), lq, lk)
    check(out, reference(fq, fk, v, s, coeff, causal=causal, mask=mask), fq, fk, v, s, log_c)


def test_banded_refuses_an_empty_side():
    fq, fk, v, _ = inputs(5, 5)
    with pytest.raises(ValueError, match="left >= 1"):
        banded_linear_attention(fq, fk, v, torch.zeros(H, 3), 0, eps=EPS)


@pytest.mark.parametrize("left", [1, 4, 30])
def test_banded_steps_equal_the_causal_forward(left):
    fq, fk, v, s = (x.detach() for x in inputs(23, 23, spread=4.0))
    log_c = torch.randn(H, left + 3, dtype=torch.float64)
    full = banded_linear_attention(
        fq, fk, v, log_c, left, causal=True, k_log_scale=s, chunk_size=4, eps=EPS
    )
    state = banded_init_state(B, H, M, dtype=torch.float64)
    steps = run_steps(banded_step, state, fq, fk, v, s, log_coeff=log_c, left=left)
    assert_close(steps, full)


@pytest.mark.parametrize("grid", [(1, 1), (3, 4), (1, 6), (5, 1), (4, 4)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_2d_fft_equals_dense_reference(grid, causal):
    length = grid[0] * grid[1]
    fq, fk, v, s = inputs(length, length)
    log_b = torch.randn(H, 2 * grid[0] - 1, 2 * grid[1] - 1, dtype=torch.float64)
    log_b.requires_grad_()
    mask = mask_for(length, (0, 2))
    out = rpe2d_linear_attention_fft(
        fq, fk, v, log_b, grid, causal=causal, k_log_scale=s, key_padding_mask=mask, eps=EPS
    )
    coeff = toeplitz2d_dense_log(log_b, grid).exp()
    check(out, reference(fq, fk, v, s, coeff, causal=causal, mask=mask), fq, fk, v, s, log_b)


def test_2d_refuses_lengths_off_the_grid():
    fq, fk, v, _ = inputs(11, 11)
    with pytest.raises(ValueError, match="h·w"):
        rpe2d_linear_attention_fft(fq, fk, v, torch.zeros(H, 5, 5), (3, 3), eps=EPS)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_stay_finite_and_close(dtype):
    fq, fk, v, s = (x.detach() for x in inputs(40, 40))
    log_c = torch.randn(H, 79, dtype=torch.float64)
    half = [x.to(dtype) for x in (fq, fk, v, s)]
    for causal in (False, True):
        out = rpe_linear_attention_fft(
            *half[:3], log_c, causal=causal, k_log_scale=half[3], eps=EPS
        )
        ref = rpe_linear_attention_fft(
            *(x.double() for x in half[:3]),
            log_c,
            causal=causal,
            k_log_scale=half[3].double(),
            eps=EPS,
        )
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out, ref)


def test_clamp_to_value_range_ignores_padding():
    v = torch.tensor([[[[1.0], [5.0], [100.0]]]])
    out = torch.tensor([[[[-3.0], [3.0], [1e9]]]])
    mask = torch.tensor([[False, False, True]])
    clamped = clamp_to_value_range(out, v, mask)
    assert clamped.flatten().tolist() == [1.0, 3.0, 5.0]
    assert clamp_to_value_range(out, v, torch.ones(1, 3, dtype=torch.bool)).abs().max() == 0


def test_fft_with_positive_weights_stays_in_the_value_range_in_half_precision():
    fq, fk, v, s = (x.detach().float() for x in inputs(64, 64))
    s[..., 40:] = 60.0  # rows before 40 carry weights far below the largest ones
    log_c = torch.randn(H, 127)
    for dtype in (torch.float16, torch.bfloat16):
        out = rpe_linear_attention_fft(
            fq.to(dtype),
            fk.to(dtype),
            v.to(dtype),
            log_c,
            k_log_scale=s,
            convex=True,
            eps=EPS,
            fft_dtype=torch.float32,
        )
        assert torch.isfinite(out).all()
        assert (out.float().abs() <= v.abs().amax(dim=2, keepdim=True) + 1e-2).all()


def test_causal_band_with_a_large_far_coefficient_keeps_fp32_precision():
    fq, fk, v, s = (x.detach() for x in inputs(64, 64))
    log_c = torch.zeros(H, 17, dtype=torch.float64)
    log_c[:, 0] = 15.0  # the far-left coefficient e^15 times the band's
    out = banded_linear_attention(
        *(x.float() for x in (fq, fk, v)),
        log_c.float(),
        8,
        causal=True,
        k_log_scale=s.float(),
        chunk_size=16,
        eps=EPS,
    )
    coeff = toeplitz_dense(banded_log_coefficients(log_c, 8, 64, 64).exp(), 64, 64)
    ref = reference(fq, fk, v, s, coeff, causal=True, mask=None)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_prefill_without_log_scales_from_a_state_that_has_them():
    fq, fk, v, s = (x.detach() for x in inputs(8, 8))
    s = s + 5.0
    _, state = linear_attention_prefill(
        fq[:, :, :4], fk[:, :, :4], v[:, :, :4], k_log_scale=s[:, :, :4]
    )
    out, _ = linear_attention_prefill(fq[:, :, 4:], fk[:, :, 4:], v[:, :, 4:], state)
    zeros = torch.zeros_like(s[:, :, 4:])
    ref = linear_attention_reference(
        fq, fk * torch.exp(torch.cat([s[:, :, :4], zeros], 2))[..., None], v, causal=True
    )
    assert_close(out, ref[:, :, 4:])
