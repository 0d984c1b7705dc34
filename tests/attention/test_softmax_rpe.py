"""Softmax attention with a relative bias, and over normalised q/k with a learnable temperature
(``softmax_rpe``, ``normalized_softmax``): fast path against the dense reference, decoding
against the causal forward, the bias convention shared with kernelized attention's ``rpe``."""

import math

import pytest
import torch

import kattn
from kattn.attention import RelativeSoftmaxAttention
from kattn.bench.mechanism_error import EXACT_REFERENCES
from kattn.functional import (
    biased_softmax_attention,
    biased_softmax_attention_reference,
    biased_softmax_prefill,
    softmax_init_state,
)

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

H, D, DV, MAX_LEN = 3, 16, 8, 40
CASES = {  # id: (Lq, Lk, causal, padded keys per batch row or None)
    "1": (1, 1, False, None),
    "1-causal": (1, 1, True, None),
    "7": (7, 7, False, None),
    "7-causal-pad": (7, 7, True, (0, 3)),
    "33": (33, 33, False, None),
    "33-causal": (33, 33, True, None),
    "33-pad": (33, 33, False, (5, 33)),  # row 1 fully padded
    "33-causal-pad": (33, 33, True, (0, 5)),
    "7x33-pad": (7, 33, False, (4, 0)),
    "33x7": (33, 7, False, None),
}
VARIANTS = {
    "softmax_rpe": ("softmax_rpe", {}),
    "softmax_rpe-bucketed": (
        "softmax_rpe",
        {"rpe": "bucketed", "num_buckets": 8, "max_distance": 12},
    ),
    "softmax_rpe-decay": ("softmax_rpe", {"rpe": "decay"}),
    "normalized_softmax": ("normalized_softmax", {}),
    "normalized_softmax-toeplitz": ("normalized_softmax", {"rpe": "toeplitz"}),
    "normalized_softmax-fixed-temperature": (
        "normalized_softmax",
        {"rpe": "toeplitz", "learn_temperature": False, "temperature": 3.0},
    ),
}


def build(name, *, seed=0, **options):
    """The mechanism in float64 with random relative biases and temperatures (they start at
    0 and 1, which would hide offset or head mix-ups)."""
    torch.manual_seed(seed)
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **options).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.7 * torch.randn_like(p))
    return attn


def inputs(lq, lk, pads, *, seed=0):
    q, k, v = qkv(2, H, lq, lk, D, DV, seed=seed, requires_grad=True)
    return q, k, v, None if pads is None else padding_mask(2, lk, pads)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
def test_fast_path_equals_reference_forward_and_gradients(variant, case):
    name, options = VARIANTS[variant]
    lq, lk, causal, pads = CASES[case]
    attn = build(name, **options).eval()
    q, k, v, mask = inputs(lq, lk, pads)
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    tensors = [q, k, v, *attn.parameters()]
    assert len(tensors) > 3 or variant == "normalized_softmax-fixed-temperature"
    for fast, slow in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        assert (fast is None) == (slow is None)
        if slow is not None:
            assert_close(fast, slow)


def test_fully_padded_rows_give_zeros_and_finite_gradients():
    attn = build("normalized_softmax", rpe="toeplitz")
    q, k, v, mask = inputs(33, 33, (0, 33))
    out = attn(q, k, v, key_padding_mask=mask)
    assert out[1].abs().max() == 0 and out[0].abs().max() > 0
    assert all(torch.isfinite(g).all() for g in grads(out, q, k, v, *attn.parameters()))


def test_two_dimensional_encoding_equals_reference():
    attn = build("softmax_rpe", rpe="toeplitz2d", grid=(5, 7))
    assert attn.supports_recurrent and not attn.supports_cross
    q, k, v, mask = inputs(35, 35, (0, 6))
    for causal in (False, True):
        out = attn(q, k, v, causal=causal, key_padding_mask=mask)
        assert_close(out, attn.reference(q, k, v, causal=causal, key_padding_mask=mask))
    with pytest.raises(NotImplementedError, match="Toeplitz2dBias"):
        attn(q[:, :, :7], k, v)


@pytest.mark.parametrize("case", ["7", "33-causal-pad", "7x33-pad"])
def test_functional_fast_path_equals_its_reference(case):
    lq, lk, causal, pads = CASES[case]
    q, k, v, mask = inputs(lq, lk, pads)
    bias = torch.randn(H, lq, lk, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    bias.requires_grad_()
    kwargs = {"causal": causal, "key_padding_mask": mask, "scale": 0.3}
    fast = biased_softmax_attention(q, k, v, bias, **kwargs)
    ref = biased_softmax_attention_reference(q, k, v, bias, **kwargs)
    assert_close(fast, ref)
    for a, b in zip(grads(fast, q, k, v, bias), grads(ref, q, k, v, bias), strict=True):
        assert_close(a, b)


def test_functional_prefill_after_cached_tokens_equals_the_causal_forward():
    q, k, v, _ = inputs(12, 12, None)
    bias = torch.randn(H, 12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    full = biased_softmax_attention(q, k, v, bias, causal=True)
    state = softmax_init_state(2, H, D, dtype=torch.float64)
    first, state = biased_softmax_prefill(
        q[:, :, :5], k[:, :, :5], v[:, :, :5], state, bias[:, :5, :5]
    )
    rest, state = biased_softmax_prefill(
        q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], state, bias[:, 5:, :]
    )
    assert state.length == 12
    assert_close(torch.cat([first, rest], dim=2), full)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoding_step_by_step_and_by_prefill_equals_the_causal_forward(variant):
    name, options = VARIANTS[variant]
    attn = build(name, **options).eval()
    q, k, v, _ = inputs(33, 33, None)
    full = attn(q, k, v, causal=True)
    steps, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=torch.float64))
    assert_close(steps, full)
    head, state = attn.prefill(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    tail, state = attn.prefill(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], state)
    assert_close(torch.cat([head, tail], dim=2), full)


def test_decoding_past_max_len_is_refused():
    attn = build("softmax_rpe")
    q, k, v, _ = inputs(MAX_LEN + 1, MAX_LEN + 1, None)
    with torch.no_grad():
        _, state = attn.prefill(q[:, :, :MAX_LEN], k[:, :, :MAX_LEN], v[:, :, :MAX_LEN])
        with pytest.raises(ValueError, match="max_len"):
            attn.step(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], state)


def test_the_bias_is_the_log_of_the_encodings_coefficients():
    """softmax_rpe = softmax(s·q·k + log c) v with c = rpe.dense(...), the coefficients that
    kernelized attention multiplies its terms by."""
    attn = build("softmax_rpe", rpe="bucketed", num_buckets=8, max_distance=12)
    q, k, v, _ = inputs(13, 21, None)
    coeff = attn.rpe.dense(13, 21)  # (H, Lq, Lk) = exp(b_{j−i})
    weights = torch.softmax(q @ k.transpose(-1, -2) * D**-0.5 + torch.log(coeff), dim=-1)
    assert_close(attn(q, k, v), weights @ v)
    # the same entry b_{j−i} for query 12 and key 20 as for query 0 and key 8 (offset 8)
    assert coeff[:, 12, 20].equal(coeff[:, 0, 8]) and coeff.std() > 0.1


def test_nprf_rpe_encoding_parameters_load_into_normalized_softmax():
    torch.manual_seed(0)
    kernelized = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN)
    with torch.no_grad():
        kernelized.rpe.bias.normal_()
    soft = kattn.build(
        "normalized_softmax", head_dim=D, num_heads=H, max_len=MAX_LEN, rpe="toeplitz"
    )
    rpe_entries = {k: v for k, v in kernelized.state_dict().items() if k.startswith("rpe.")}
    assert list(rpe_entries) == ["rpe.bias"]
    soft.load_state_dict({**soft.state_dict(), **rpe_entries}, strict=True)
    assert torch.equal(soft.rpe.dense(9, 9), kernelized.rpe.dense(9, 9))


def test_normalized_softmax_without_bias_is_softmax_of_unit_queries_and_keys():
    """At τ = 1 and zero bias: exactly what nprf_rpe estimates (``softmax_unit_qk``)."""
    attn = kattn.build(
        "normalized_softmax", head_dim=D, num_heads=H, max_len=MAX_LEN, rpe="toeplitz"
    ).double()
    q, k, v, _ = inputs(17, 17, None)
    for causal in (False, True):
        assert_close(
            attn(q, k, v, causal=causal), EXACT_REFERENCES["softmax_unit_qk"](q, k, v, causal)
        )


def test_each_heads_temperature_scales_its_normalised_logits():
    attn = build("normalized_softmax", rpe="toeplitz").eval()
    q, k, v, _ = inputs(11, 11, None)
    out = attn(q, k, v)
    tau = attn.log_temperature.detach().exp()
    for h in range(H):
        one = kattn.build(
            "softmax_rpe",
            head_dim=D,
            num_heads=1,
            max_len=MAX_LEN,
            normalize_qk=True,
            scale=float(tau[h]),
        ).double()
        with torch.no_grad():
            one.rpe.bias.copy_(attn.rpe.bias[h : h + 1])
        assert_close(out[:, h : h + 1], one(q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1]))


def test_a_learnt_temperature_gets_gradients_per_head():
    attn = build("normalized_softmax").train()
    assert isinstance(attn.log_temperature, torch.nn.Parameter)
    assert attn.log_temperature.shape == (H,)
    q, k, v, _ = inputs(9, 9, None)
    attn(q, k, v, causal=True).pow(2).sum().backward()
    grad = attn.log_temperature.grad
    assert grad is not None and (grad.abs() > 1e-6).all()


def test_temperature_storage():
    fixed = kattn.build(
        "normalized_softmax", head_dim=D, num_heads=H, learn_temperature=False, temperature=2.0
    )
    assert "log_temperature" in dict(fixed.named_buffers())
    assert not any(n == "log_temperature" for n, _ in fixed.named_parameters())
    torch.testing.assert_close(fixed.log_temperature, torch.full((H,), math.log(2.0)))
    plain = kattn.build("normalized_softmax", head_dim=D, num_heads=H, learn_temperature=False)
    assert plain.log_temperature is None and "log_temperature" not in plain.state_dict()
    assert "temperature=(2, 2, 2) fixed" in repr(fixed)


def test_defaults_of_the_two_presets():
    rel = kattn.build("softmax_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN)
    assert isinstance(rel, RelativeSoftmaxAttention) and rel.rpe is not None
    assert not rel.normalize_qk and rel.scale == D**-0.5 and rel.log_temperature is None
    norm = kattn.build("normalized_softmax", head_dim=D, num_heads=H)
    assert norm.rpe is None and norm.normalize_qk and norm.scale == 1.0
    assert isinstance(norm.log_temperature, torch.nn.Parameter)
    assert kattn.spec("normalized_softmax").is_exact and kattn.spec("softmax_rpe").is_exact


def test_a_shared_encoding_module_is_used_as_it_is():
    shared = kattn.positional.build("toeplitz", num_heads=H, max_len=MAX_LEN)
    a, b = (
        kattn.build("softmax_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN, rpe=shared)
        for _ in range(2)
    )
    assert a.rpe is shared and b.rpe is shared


def test_options_are_validated():
    sizes = {"head_dim": D, "num_heads": H, "max_len": MAX_LEN}
    with pytest.raises(ValueError, match="normalize_qk=True"):
        kattn.build("softmax_rpe", **sizes, learn_temperature=True)
    with pytest.raises(ValueError, match="normalize_qk=True"):
        kattn.build("softmax_rpe", **sizes, temperature=2.0)
    with pytest.raises(ValueError, match="temperature must be positive"):
        kattn.build("normalized_softmax", **sizes, temperature=0.0)
    with pytest.raises(TypeError, match="'temperature'"):
        kattn.build("normalized_softmax", **sizes, temperature="2")
    with pytest.raises(TypeError, match="rpe_method"):
        kattn.build("softmax_rpe", **sizes, rpe_method="fft")
    with pytest.raises(TypeError, match="rpe_method"):
        RelativeSoftmaxAttention(**sizes, rpe="toeplitz", rpe_method="fft")
    with pytest.raises(TypeError, match="num_buckets"):
        kattn.build("normalized_softmax", **sizes, num_buckets=4)
    shared = kattn.positional.build("bucketed", num_heads=H)
    with pytest.raises(TypeError, match="num_buckets"):
        kattn.build("softmax_rpe", **sizes, rpe=shared, num_buckets=8)
    with pytest.raises(TypeError, match="module already"):
        RelativeSoftmaxAttention(**sizes, rpe=shared, num_buckets=8)


def test_dropout_only_in_training():
    attn = kattn.build("softmax_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN, dropout=0.5)
    q, k, v, _ = inputs(20, 20, None)
    q, k, v = (x.detach().float() for x in (q, k, v))
    torch.manual_seed(0)
    dropped = attn.train()(q, k, v)
    kept = attn.eval()(q, k, v)
    assert (dropped - kept).abs().max() > 1e-3
    assert_close(kept, attn.reference(q, k, v))
