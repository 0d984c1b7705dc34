"""Linear attention: every fast path equals the quadratic reference, forward and gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kattn.functional import (
    LinearState,
    linear_attention,
    linear_attention_chunked,
    linear_attention_cumsum,
    linear_attention_init_state,
    linear_attention_parallel,
    linear_attention_prefill,
    linear_attention_reference,
    linear_attention_step,
)

from ..helpers import assert_close, grads, padding_mask

B, H, M, DV = 2, 3, 6, 5


def features(length, *, log_scales=True, seed=0, spread=3.0, requires_grad=False):
    """Bounded positive features, optional per-key log-scales, values; all float64."""
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(B, H, length, M, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(B, H, length, M, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(B, H, length, DV, generator=g, dtype=torch.float64)
    s = torch.randn(B, H, length, generator=g, dtype=torch.float64) * spread if log_scales else None
    tensors = [fq, fk, v] + ([s] if s is not None else [])
    for x in tensors:
        x.requires_grad_(requires_grad)
    return fq, fk, v, s


def dense(fk, s):
    return fk if s is None else fk * torch.exp(s)[..., None]


def run_steps(fq, fk, v, s, length):
    """Outputs of ``length`` recurrent steps from a fresh state, and the final state."""
    state = linear_attention_init_state(B, H, M, 0, dtype=fq.dtype)
    outs = []
    for t in range(length):
        one = slice(t, t + 1)
        out, state = linear_attention_step(
            fq[:, :, one],
            fk[:, :, one],
            v[:, :, one],
            state,
            k_log_scale=None if s is None else s[:, :, one],
        )
        outs.append(out)
    return torch.cat(outs, dim=2), state


LENGTHS = [1, 7, 37, 64, 130]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("chunk", [1, 8, 64])
@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scaled"])
@pytest.mark.parametrize("pads", [None, (3, 0)], ids=["no_pad", "pad"])
def test_chunked_equals_reference(length, chunk, log_scales, pads):
    fq, fk, v, s = features(length, log_scales=log_scales)
    pads = None if pads is None else tuple(min(p, length - 1) for p in pads)
    mask = None if pads is None else padding_mask(B, length, pads)
    out = linear_attention_chunked(
        fq, fk, v, k_log_scale=s, key_padding_mask=mask, chunk_size=chunk, block_size=24
    )
    ref = linear_attention_reference(fq, dense(fk, s), v, causal=True, key_padding_mask=mask)
    assert_close(out, ref)


@pytest.mark.parametrize(
    ("log_scales", "spread"),
    [(False, 0.0), (True, 3.0), (True, 40.0)],
    ids=["plain", "chunk_offsets", "steep_per_query_offsets"],
)
def test_chunked_gradients_equal_reference(log_scales, spread):
    fq, fk, v, s = features(45, log_scales=log_scales, spread=spread, requires_grad=True)
    mask = padding_mask(B, 45, (0, 6))
    inputs = [fq, fk, v] + ([s] if s is not None else [])
    out = linear_attention_chunked(
        fq, fk, v, k_log_scale=s, key_padding_mask=mask, chunk_size=8, block_size=16
    )
    # the kernel guards its normaliser relative to the largest key; with keys e^±100 apart the
    # reference must not guard its absolute normaliser
    ref = linear_attention_reference(
        fq, dense(fk, s), v, causal=True, key_padding_mask=mask, eps=1e-300
    )
    for a, b in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scaled"])
@pytest.mark.parametrize(("lq", "lk"), [(37, 37), (11, 29), (29, 11)])
def test_parallel_equals_reference_forward_and_gradients(log_scales, lq, lk):
    fq, _, _, _ = features(lq, log_scales=False, requires_grad=True)
    _, fk, v, s = features(lk, log_scales=log_scales, seed=1, requires_grad=True)
    mask = padding_mask(B, lk, (2, 5))
    out = linear_attention_parallel(fq, fk, v, k_log_scale=s, key_padding_mask=mask)
    ref = linear_attention_reference(fq, dense(fk, s), v, key_padding_mask=mask)
    assert_close(out, ref)
    inputs = [fq, fk, v] + ([s] if s is not None else [])
    for a, b in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(a, b)


def test_dispatcher_picks_the_causal_form():
    fq, fk, v, s = features(20)
    assert_close(
        linear_attention(fq, fk, v, k_log_scale=s, causal=True),
        linear_attention_reference(fq, dense(fk, s), v, causal=True),
    )
    assert_close(
        linear_attention(fq, fk, v, k_log_scale=s), linear_attention_reference(fq, dense(fk, s), v)
    )


def test_cumsum_equals_reference():
    fq, fk, v, _ = features(33, log_scales=False)
    mask = padding_mask(B, 33, (4, 0))
    assert_close(
        linear_attention_cumsum(fq, fk, v, key_padding_mask=mask),
        linear_attention_reference(fq, fk, v, causal=True, key_padding_mask=mask),
    )


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scaled"])
def test_chunked_equals_recurrent_steps(log_scales):
    fq, fk, v, s = features(29, log_scales=log_scales)
    full = linear_attention_chunked(fq, fk, v, k_log_scale=s, chunk_size=4)
    steps, state = run_steps(fq, fk, v, s, 29)
    assert_close(steps, full)
    _, final = linear_attention_prefill(fq, fk, v, k_log_scale=s, chunk_size=4)
    for a, b in zip(state, final, strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("split", [1, 13, 32])
def test_prefill_continues_from_a_state(split):
    fq, fk, v, s = features(45)
    whole = linear_attention_chunked(fq, fk, v, k_log_scale=s, chunk_size=8)
    first, state = linear_attention_prefill(
        fq[:, :, :split],
        fk[:, :, :split],
        v[:, :, :split],
        k_log_scale=s[:, :, :split],
        chunk_size=8,
    )
    second, _ = linear_attention_prefill(
        fq[:, :, split:],
        fk[:, :, split:],
        v[:, :, split:],
        state,
        k_log_scale=s[:, :, split:],
        chunk_size=8,
    )
    assert_close(torch.cat([first, second], dim=2), whole)


@pytest.mark.parametrize("jump", [10.0, 29.0, 31.0, 200.0])
def test_steep_rises_inside_a_chunk_are_exact(jump):
    """Both ways of offsetting a chunk (one offset, or one per query when the running maximum
    rises more than MAX_CHUNK_RISE inside it) equal the reference."""
    fq, fk, v, s = features(40, spread=1.0)
    s = s.clone()
    s[:, :, 20] += jump
    out = linear_attention_chunked(fq, fk, v, k_log_scale=s, chunk_size=32)
    assert_close(out, linear_attention_reference(fq, dense(fk, s), v, causal=True))


def test_offsets_never_use_a_future_key():
    """A key with a huge log-scale later on must not change a single earlier output.

    A stabiliser that subtracts a maximum over the whole sequence underflows every earlier
    key here (exp(−400)) and returns zeros; the running maximum keeps them exact.
    """
    fq, fk, v, s = (x.float() for x in features(70, spread=1.0))
    s_future = s.clone()
    s_future[:, :, 50] = 400.0
    before = linear_attention_chunked(fq, fk, v, k_log_scale=s, chunk_size=64)
    after = linear_attention_chunked(fq, fk, v, k_log_scale=s_future, chunk_size=64)
    assert_close(after[:, :, :50], before[:, :, :50])
    assert after[:, :, :50].abs().amax() > 0.05  # not the zeros of an underflow
    steps, _ = run_steps(fq, fk, v, s_future, 50)
    assert_close(steps[:, :, -1], before[:, :, 49])


def test_huge_log_scales_stay_finite_in_fp32():
    fq, fk, v, s = (x.float() for x in features(50))
    s = s * 1000.0  # spreads of thousands of nats
    for causal in (False, True):
        out = linear_attention(fq, fk, v, k_log_scale=s, causal=causal)
        assert torch.isfinite(out).all()


def test_zero_features_never_divide_by_zero():
    fq, fk, v, _ = features(20, log_scales=False)
    zero = torch.zeros_like(fk)
    for causal in (False, True):
        out = linear_attention(fq, zero, v, causal=causal)
        assert torch.isfinite(out).all() and out.abs().max() == 0


def test_signed_normaliser_is_guarded_with_its_sign():
    fq = torch.tensor([[[[1.0, -1.0]]]], dtype=torch.float64)
    fk = torch.tensor([[[[1.0, 1.0 + 1e-9]]]], dtype=torch.float64)
    v = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    out = linear_attention_parallel(fq, fk, v, eps=1e-6)
    # num = den = −1e-9: the guard keeps the sign (−1e-6), so the ratio stays positive
    assert out.item() == pytest.approx(1e-3, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_inputs_accumulate_in_fp32(dtype, causal):
    fq, fk, v, s = features(40)
    fq, fk, v, s = (x.to(dtype) for x in (fq, fk, v, s))
    out = linear_attention(fq, fk, v, k_log_scale=s, causal=causal)
    assert out.dtype == dtype
    ref = linear_attention(
        *(x.double() for x in (fq, fk, v)), k_log_scale=s.double(), causal=causal
    )
    assert_close(out, ref)


def test_state_checks():
    fq, fk, v, _ = features(3)
    bad = linear_attention_init_state(B, H, M + 1, DV)
    with pytest.raises(ValueError, match=r"state\.kv"):
        linear_attention_step(fq[:, :, :1], fk[:, :, :1], v[:, :, :1], bad)
    with pytest.raises(ValueError, match="LinearState"):
        linear_attention_step(fq[:, :, :1], fk[:, :, :1], v[:, :, :1], (1, 2, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention_chunked(fq, fk, v, chunk_size=0)
    assert isinstance(linear_attention_init_state(1, 1, 2, 0), LinearState)


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(1, 90),
    chunk=st.integers(1, 40),
    block=st.integers(1, 100),
    pad=st.integers(0, 10),
    log_scales=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_matches_reference_property(length, chunk, block, pad, log_scales, seed):
    fq, fk, v, s = features(length, log_scales=log_scales, seed=seed)
    mask = padding_mask(B, length, (min(pad, length), 0))
    out = linear_attention_chunked(
        fq, fk, v, k_log_scale=s, key_padding_mask=mask, chunk_size=chunk, block_size=block
    )
    ref = linear_attention_reference(fq, dense(fk, s), v, causal=True, key_padding_mask=mask)
    assert_close(out, ref)
