"""Gated linear attention (RFA-Gate's recurrence): the chunkwise-parallel form against the
token-by-token recurrence and the dense log-weights (forward and gradients, float64), chunk and
block boundaries, prefill and steps, padded tokens that leave the state unchanged, no future
leak, stability under large key scales and extreme gates, half precision."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import (
    gated_linear_attention,
    gated_linear_attention_prefill,
    gated_linear_attention_reference,
    gated_linear_attention_step,
    gated_log_weights,
    linear_attention_init_state,
    linear_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask

B, H, L, M, DV = 2, 3, 37, 6, 5


def inputs(length=L, *, dtype=torch.float64, seed=0, signed=False, log_scale=2.0, gate=1.5):
    """Features (positive, or signed like TRF), values, gate logits, key log-scales."""
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(B, H, length, M, generator=g, dtype=torch.float64)
    fk = torch.rand(B, H, length, M, generator=g, dtype=torch.float64)
    if signed:
        fq, fk = 2 * fq - 1, 2 * fk - 1
    v = torch.randn(B, H, length, DV, generator=g, dtype=torch.float64)
    x = torch.randn(B, H, length, generator=g, dtype=torch.float64) * gate
    s = torch.randn(B, H, length, generator=g, dtype=torch.float64) * log_scale
    return [t.to(dtype).requires_grad_() for t in (fq, fk, v, x, s)]


def reference(fq, fk, v, x, s, **kwargs):
    return gated_linear_attention_reference(fq, fk * s.exp()[..., None], v, x, **kwargs)


def check_grads(out, ref, tensors, ref_tensors=None):
    """Gradients of ``out`` and ``ref`` agree (those of ``ref`` w.r.t. ``ref_tensors``)."""
    slow_grads = grads(ref, *(tensors if ref_tensors is None else ref_tensors))
    for fast, slow in zip(grads(out, *tensors), slow_grads, strict=True):
        assert torch.isfinite(fast).all()
        torch.testing.assert_close(fast, slow, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("chunk", "block"), [(1, 4096), (5, 4096), (8, 16), (64, 4096)])
def test_chunked_equals_the_token_by_token_recurrence(causal, chunk, block):
    fq, fk, v, x, s = clean = inputs()
    mask = padding_mask(B, L, (0, 6))
    mask[0, 11] = True  # a padded key in the middle of a chunk
    # whatever padded keys hold must count nowhere: NaN features, values and gate logits
    pad = mask[:, None, :].expand(B, H, L)
    dirty_fk, dirty_v, dirty_x = (t.detach().clone() for t in (fk, v, x))
    for t in (dirty_fk, dirty_v, dirty_x):
        t[pad] = float("nan")
        t.requires_grad_()
    kwargs = {"causal": causal, "key_padding_mask": mask}
    out = gated_linear_attention(
        fq, dirty_fk, dirty_v, dirty_x, k_log_scale=s, chunk_size=chunk, block_size=block,
        **kwargs,
    )  # fmt: skip
    ref = reference(fq, fk, v, x, s, **kwargs)
    assert torch.isfinite(out).all()
    assert_close(out, ref)
    check_grads(out, ref, [fq, dirty_fk, dirty_v, dirty_x, s], clean)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_dense_log_weights_give_the_recurrence(causal):
    fq, fk, v, x, _ = inputs(signed=True)
    mask = padding_mask(B, L, (3, 0))
    weights = gated_log_weights(x, causal=causal, key_padding_mask=mask).exp()
    dense = linear_attention_reference(
        fq, fk, v, causal=causal, key_padding_mask=mask, coeff=weights
    )
    ref = gated_linear_attention_reference(fq, fk, v, x, causal=causal, key_padding_mask=mask)
    assert_close(dense, ref)
    # and the weights are the paper's: (1 − g_j) Π_{j<l<=i} g_l, checked at one entry
    g = torch.sigmoid(x[0, 1])
    assert_close(weights[0, 1, 9, 4], (1 - g[4]) * g[5:10].prod())
    if not causal:  # the mirror image: (1 − g_j) Π_{i<=l<j} g_l
        assert_close(weights[0, 1, 4, 9], (1 - g[9]) * g[4:9].prod())


def test_signed_features_and_a_state_carried_over_many_blocks():
    fq, fk, v, x, s = tensors = inputs(101, signed=True, log_scale=0.5)
    out = gated_linear_attention(fq, fk, v, x, k_log_scale=s, chunk_size=3, block_size=9)
    ref = reference(fq, fk, v, x, s)
    assert_close(out, ref)
    check_grads(out, ref, tensors)


def test_prefill_and_steps_continue_the_causal_forward():
    fq, fk, v, x, s = (t.detach() for t in inputs())
    expected = gated_linear_attention(fq, fk, v, x, k_log_scale=s, chunk_size=4)
    first, state = gated_linear_attention_prefill(
        fq[:, :, :13], fk[:, :, :13], v[:, :, :13], x[:, :, :13], k_log_scale=s[:, :, :13],
        chunk_size=4,
    )  # fmt: skip
    outs = [first]
    part = slice(13, 22)
    second, state = gated_linear_attention_prefill(
        fq[:, :, part], fk[:, :, part], v[:, :, part], x[:, :, part], state,
        k_log_scale=s[:, :, part], chunk_size=4,
    )  # fmt: skip
    outs.append(second)
    for t in range(22, L):
        one = slice(t, t + 1)
        out, state = gated_linear_attention_step(
            fq[:, :, one], fk[:, :, one], v[:, :, one], x[:, :, one], state,
            k_log_scale=s[:, :, one],
        )  # fmt: skip
        outs.append(out)
    assert_close(torch.cat(outs, dim=2), expected)


def test_steps_from_an_empty_state_with_gradients():
    fq, fk, v, x, s = tensors = inputs(9)
    state = linear_attention_init_state(B, H, M, 0, dtype=torch.float64)
    outs = []
    for t in range(9):
        one = slice(t, t + 1)
        out, state = gated_linear_attention_step(
            fq[:, :, one], fk[:, :, one], v[:, :, one], x[:, :, one], state,
            k_log_scale=s[:, :, one],
        )  # fmt: skip
        outs.append(out)
    steps = torch.cat(outs, dim=2)
    ref = reference(fq, fk, v, x, s)
    assert_close(steps, ref)
    check_grads(steps, ref, tensors)


def test_a_padded_token_leaves_the_state_unchanged():
    fq, fk, v, x, s = (t.detach() for t in inputs())
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, 17] = True
    keep = ~mask[0]
    out, state = gated_linear_attention_prefill(
        fq, fk, v, x, k_log_scale=s, key_padding_mask=mask, chunk_size=8
    )
    short, short_state = gated_linear_attention_prefill(
        *(t[:, :, keep] for t in (fq, fk, v, x)), k_log_scale=s[:, :, keep], chunk_size=8
    )
    assert_close(out[:, :, keep], short)
    for a, b in zip(state, short_state, strict=True):
        assert_close(a * 1.0, b * 1.0)


@pytest.mark.parametrize("chunk", [4, 64])
def test_future_tokens_change_no_earlier_output(chunk):
    fq, fk, v, x, s = (t.detach().float() for t in inputs())
    t0 = 20
    changed = [t.clone() for t in (fq, fk, v, x, s)]
    for t in changed:
        t[:, :, t0 + 1 :] = torch.randn_like(t[:, :, t0 + 1 :]) * 50
    out = gated_linear_attention(fq, fk, v, x, k_log_scale=s, chunk_size=chunk)
    out2 = gated_linear_attention(*changed[:4], k_log_scale=changed[4], chunk_size=chunk)
    assert torch.equal(out[:, :, : t0 + 1], out2[:, :, : t0 + 1])


def test_large_key_scales_and_extreme_gates_stay_accurate_in_float32():
    # key log-scales up to ~300 (exp overflows fp32) and gates from σ(−40) to σ(40)
    fq, fk, v, x, s = (t.detach() for t in inputs(200, log_scale=100.0, gate=20.0))
    for causal in (True, False):
        # float64, where exp(±300) is representable (and a guard far below its normalisers)
        ref = reference(fq, fk, v, x, s, causal=causal, eps=1e-300)
        out = gated_linear_attention(
            *(t.float() for t in (fq, fk, v, x)), k_log_scale=s.float(), causal=causal
        )
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-4)


def test_long_strongly_gated_sequences_keep_float32_accuracy():
    # 4000 tokens with g ≈ σ(−3): the cumulative log-gate reaches about −12,000, so a global
    # cumulative sum in fp32 would put errors of ~1e-3 into every weight
    fq, fk, v, x, _ = (t.detach()[:1, :1] for t in inputs(4000, gate=0.5, log_scale=0.0))
    x = x - 3.0
    ref = gated_linear_attention_reference(fq, fk, v, x)
    out = gated_linear_attention(*(t.float() for t in (fq, fk, v, x)))
    torch.testing.assert_close(out, ref.float(), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_half_precision_inputs(dtype, causal):
    fq, fk, v, x, s = (t.detach() for t in inputs(signed=False))
    half = [t.to(dtype) for t in (fq, fk, v, x, s)]
    out = gated_linear_attention(*half[:4], k_log_scale=half[4], causal=causal, chunk_size=8)
    exact = gated_linear_attention(
        *(t.double() for t in half[:4]), k_log_scale=half[4].double(), causal=causal
    )
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert_close(out, exact)


def test_bad_chunk_sizes_are_refused():
    fq, fk, v, x, _ = (t.detach() for t in inputs(5))
    with pytest.raises(ValueError, match="chunk_size and block_size must be positive"):
        gated_linear_attention(fq, fk, v, x, chunk_size=0)
