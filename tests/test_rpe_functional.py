"""Relative-position weighted linear attention: FFT, banded, decay and 2-D paths against the dense
``C ⊙ (φ(Q)φ(K)ᵀ)`` reference, forward and gradients."""

import math

import pytest
import torch

from kattn.functional.banded import (
    banded_init_state,
    banded_linear_attention,
    banded_log_coefficients,
    banded_step,
)
from kattn.functional.decay import (
    decay_init_state,
    decay_linear_attention,
    decay_log_coefficients,
    decay_step,
)
from kattn.functional.linear import linear_attention_reference
from kattn.functional.linear_causal import causal_linear_sums, linear_attention_prefill
from kattn.functional.toeplitz import (
    circulant_embedding,
    clamp_to_value_range,
    fft_length,
    rpe_linear_attention_fft,
    toeplitz_dense,
    toeplitz_matmul,
)
from kattn.functional.toeplitz2d import rpe2d_linear_attention_fft, toeplitz2d_dense_log

from .helpers import assert_close, grads, padding_mask

B, H, M, DV = 2, 3, 5, 4
EPS = 1e-30  # positive features: the guard only catches a zero normaliser


@pytest.fixture(autouse=True)
def _seeded():
    """Coefficients drawn with the global generator are the same whatever the test order."""
    torch.manual_seed(1234)


def inputs(lq, lk, *, seed=0, spread=2.0):
    """float64 positive features, values and key log-scales, all requiring grad."""
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(B, H, lq, M, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(B, H, lk, M, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(B, H, lk, DV, generator=g, dtype=torch.float64)
    s = torch.randn(B, H, lk, generator=g, dtype=torch.float64) * spread
    return [x.requires_grad_() for x in (fq, fk, v, s)]


def reference(fq, fk, v, s, coeff, *, causal, mask):
    return linear_attention_reference(
        fq,
        fk * torch.exp(s)[..., None],
        v,
        causal=causal,
        key_padding_mask=mask,
        coeff=coeff,
        eps=EPS,
    )


def check(fast, ref, *tensors):
    assert_close(fast, ref)
    for a, b in zip(grads(fast, *tensors), grads(ref, *tensors), strict=True):
        # FFT round-off is relative to the largest entry, not to each one
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * max(1.0, float(b.abs().max())))


CASES = [  # (Lq, Lk, causal)
    (1, 1, False),
    (1, 1, True),
    (17, 17, False),
    (17, 17, True),
    (40, 40, True),
    (13, 21, False),
    (21, 13, False),
]
IDS = [f"{lq}x{lk}{'-causal' if c else ''}" for lq, lk, c in CASES]


def mask_for(lk, pads):
    return None if pads is None else padding_mask(B, lk, tuple(min(p, lk - 1) for p in pads))


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


@pytest.mark.parametrize(("lq", "lk", "causal"), CASES, ids=IDS)
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_decay_equals_dense_reference(lq, lk, causal, chunk):
    fq, fk, v, s = inputs(lq, lk, seed=chunk)
    log_alpha = torch.randn(H, 2, 3, dtype=torch.float64).requires_grad_()
    log_gamma = (-torch.rand(H, 2, 3, dtype=torch.float64) - 0.01).requires_grad_()
    mask = mask_for(lk, (0, 3))
    out = decay_linear_attention(
        fq,
        fk,
        v,
        log_alpha,
        log_gamma,
        causal=causal,
        k_log_scale=s,
        key_padding_mask=mask,
        chunk_size=chunk,
        block_size=8,
        eps=EPS,
    )
    coeff = toeplitz_dense(decay_log_coefficients(log_alpha, log_gamma, lq, lk).exp(), lq, lk)
    check(
        out,
        reference(fq, fk, v, s, coeff, causal=causal, mask=mask),
        fq,
        fk,
        v,
        s,
        log_alpha,
        log_gamma,
    )


def test_decay_coefficients_are_sums_of_geometric_terms():
    log_alpha = torch.log(torch.tensor([[[0.5, 2.0], [1.0, 3.0]]], dtype=torch.float64))
    log_gamma = torch.log(torch.tensor([[[0.5, 0.9], [0.25, 0.8]]], dtype=torch.float64))
    c = decay_log_coefficients(log_alpha, log_gamma, 3, 3).exp()[0]  # offsets −2…2
    expected = [0.5 * 0.25 + 2 * 0.81, 0.5 * 0.5 + 2 * 0.9, 2.5, 0.25 + 3 * 0.8, 1 / 16 + 3 * 0.64]
    assert_close(c, torch.tensor(expected, dtype=torch.float64))


def run_steps(step, state, fq, fk, v, s, **kwargs):
    outs = []
    for t in range(fq.shape[2]):
        one = slice(t, t + 1)
        out, state = step(
            fq[:, :, one], fk[:, :, one], v[:, :, one], state, k_log_scale=s[:, :, one], **kwargs
        )
        outs.append(out)
    return torch.cat(outs, dim=2)


def test_decay_steps_equal_the_causal_forward():
    fq, fk, v, s = (x.detach() for x in inputs(23, 23, spread=4.0))
    log_alpha, log_gamma = torch.randn(H, 2, 2, dtype=torch.float64), -torch.rand(H, 2, 2)
    full = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, chunk_size=4, eps=EPS
    )
    state = decay_init_state(B, H, 2, M, dtype=torch.float64)
    steps = run_steps(decay_step, state, fq, fk, v, s, log_alpha=log_alpha, log_gamma=log_gamma)
    assert_close(steps, full)


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


def test_decay_offsets_follow_the_decay():
    """An early key far larger than the recent ones decays away; the recent keys must keep
    their relative weights (a non-decayed running maximum would floor them all alike)."""
    length, g = 300, torch.Generator().manual_seed(4)
    fq = torch.rand(1, 1, length, M, generator=g) + 0.05
    fk = torch.rand(1, 1, length, M, generator=g) + 0.05
    v = torch.randn(1, 1, length, DV, generator=g)
    s = torch.full((1, 1, length), -100.0)
    s[..., 0] = 0.0
    s[..., 1:] += torch.randn(length - 1, generator=g)
    log_alpha = torch.zeros(1, 2, 1)
    log_gamma = torch.full((1, 2, 1), math.log(0.75))
    out = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, chunk_size=16, eps=EPS
    )
    log_c = decay_log_coefficients(log_alpha.double(), log_gamma.double(), length, length)
    coeff = toeplitz_dense(log_c.exp(), length, length)
    fq64, fk64, v64, s64 = (x.double() for x in (fq, fk, v, s))
    # fp64 reference with a guard far below its tiny (about e^-85) normalisers
    ref = linear_attention_reference(
        fq64, fk64 * s64.exp()[..., None], v64, causal=True, coeff=coeff, eps=1e-300
    )
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    state = decay_init_state(1, 1, 1, M)
    steps = run_steps(decay_step, state, fq, fk, v, s, log_alpha=log_alpha, log_gamma=log_gamma)
    torch.testing.assert_close(steps.double(), ref, rtol=1e-4, atol=1e-5)


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


@pytest.mark.parametrize("prompt", [7, 9, 12])
def test_decay_state_after_a_prompt_continues_exactly(prompt):
    """The state after a chunked prompt (length not a multiple of the chunk) continues with
    steps as if every token had been stepped."""
    fq, fk, v, s = (x.detach() for x in inputs(15, 15, spread=3.0))
    log_alpha, log_gamma = torch.randn(H, 2, 2, dtype=torch.float64), -torch.rand(H, 2, 2) - 0.1
    full = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, eps=EPS
    )
    rep = lambda x: x.unsqueeze(2).expand(B, H, 2, *x.shape[2:]).reshape(B, H * 2, *x.shape[2:])  # noqa: E731
    p = slice(0, prompt)
    _, _, _, state = causal_linear_sums(
        rep(fq[:, :, p]),
        rep(fk[:, :, p]),
        rep(v[:, :, p]),
        rep(s[:, :, p]),
        log_decay=log_gamma[:, 0].reshape(1, -1),
        chunk_size=4,
    )
    rest = slice(prompt, 15)
    steps = run_steps(
        decay_step,
        state,
        fq[:, :, rest],
        fk[:, :, rest],
        v[:, :, rest],
        s[:, :, rest],
        log_alpha=log_alpha,
        log_gamma=log_gamma,
    )
    assert_close(steps, full[:, :, rest])


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
