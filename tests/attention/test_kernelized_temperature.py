"""Kernelized attention's per-head temperature on normalised q and k: the kernel sees
``scale · τ_h · q̂·k̂``; fast paths, reference and decoding agree, and the default (no
temperature) is unchanged."""

import pytest
import torch

import kattn

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

H, D, DV, MAX_LEN = 3, 16, 8, 48
TAU = (0.5, 1.0, 2.5)


def build(name="nprf_rpe", *, seed=0, tau=TAU, **options):
    """``name`` in float64 with the per-head temperatures ``tau`` (learnt) and a random bias."""
    torch.manual_seed(seed)
    options.setdefault("num_features", 32)
    attn = kattn.build(
        name, head_dim=D, num_heads=H, max_len=MAX_LEN, learn_temperature=True, **options
    ).double()
    with torch.no_grad():
        attn.log_temperature.copy_(torch.tensor(tau).log())
        if attn.rpe is not None:
            for p in attn.rpe.parameters():
                p.add_(0.5 * torch.randn_like(p))
    return attn


@pytest.mark.parametrize(
    "options",
    [{}, {"rpe_method": "fft"}, {"rpe": "decay"}, {"rpe": None}],
    ids=["toeplitz-auto", "toeplitz-fft", "decay", "no-rpe"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("length", [1, 7, 33])
def test_fast_path_equals_reference_forward_and_gradients(options, causal, length):
    attn = build(chunk_size=4, **options).eval()
    q, k, v = qkv(2, H, length, length, D, DV, requires_grad=True)
    mask = padding_mask(2, length, (0, min(3, length - 1)))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    tensors = [q, k, v, *attn.parameters()]
    for fast, slow in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        assert (fast is None) == (slow is None)
        if slow is not None:
            scale = max(1.0, float(slow.abs().max()))
            torch.testing.assert_close(fast, slow, rtol=1e-8, atol=1e-10 * scale)


def test_cross_attention_equals_reference():
    attn = build().eval()
    q, k, v = qkv(2, H, 7, 33, D, DV)
    assert_close(attn(q, k, v), attn.reference(q, k, v))


@pytest.mark.parametrize(
    "options", [{}, {"rpe": "bucketed"}, {"rpe": None}], ids=["toeplitz", "bucketed", "no-rpe"]
)
def test_decoding_equals_the_causal_forward(options):
    attn = build(**options).eval()
    q, k, v = qkv(2, H, 33, 33, D, DV)
    steps, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=torch.float64))
    full = attn(q, k, v, causal=True)
    assert_close(steps, full)
    head, state = attn.prefill(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    tail, _ = attn.prefill(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], state)
    assert_close(torch.cat([head, tail], dim=2), full)


def test_each_head_sees_its_temperature_as_a_scale():
    """τ_h on q̂ and k̂ (√τ_h each) is the kernel of ``scale=τ_h`` for that head alone."""
    attn = build("kernelized", feature_map="prf", normalize_qk=True, rpe="toeplitz").eval()
    q, k, v = qkv(2, H, 13, 13, D, DV)
    out = attn(q, k, v, causal=True)
    for h, tau in enumerate(TAU):
        torch.manual_seed(0)
        one = kattn.build(
            "kernelized",
            head_dim=D,
            num_heads=1,
            max_len=MAX_LEN,
            feature_map="prf",
            normalize_qk=True,
            rpe="toeplitz",
            scale=tau,
            num_features=32,
        ).double()
        one.feature_map.projection.copy_(attn.feature_map.projection)  # shared by the heads
        with torch.no_grad():
            one.rpe.bias.copy_(attn.rpe.bias[h : h + 1])
        head = (x[:, h : h + 1] for x in (q, k, v))
        # √τ on q̂ and k̂ rounds differently from τ inside the features: 1e-8, not 1e-10
        torch.testing.assert_close(out[:, h : h + 1], one(*head, causal=True), rtol=1e-6, atol=1e-8)


def test_a_learnt_temperature_gets_gradients():
    attn = build().train()
    q, k, v = qkv(2, H, 9, 9, D, DV)
    attn(q, k, v).pow(2).sum().backward()
    assert attn.log_temperature.grad is not None
    assert (attn.log_temperature.grad.abs() > 1e-8).all()


def test_the_default_has_no_temperature_and_tau_one_changes_nothing():
    torch.manual_seed(0)
    plain = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN).double()
    assert plain.log_temperature is None
    assert "log_temperature" not in plain.state_dict() and "temperature" not in repr(plain)
    torch.manual_seed(0)
    learnt = kattn.build(
        "nprf_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN, learn_temperature=True
    ).double()
    q, k, v = qkv(2, H, 17, 17, D, DV)
    assert_close(learnt(q, k, v, causal=True), plain(q, k, v, causal=True))


def test_a_fixed_temperature_is_a_buffer_and_needs_normalisation():
    attn = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN, temperature=2.0)
    assert "log_temperature" in dict(attn.named_buffers())
    with pytest.raises(ValueError, match="normalize_qk=True"):
        kattn.build("performer", head_dim=D, num_heads=H, learn_temperature=True)
    with pytest.raises(TypeError, match="'learn_temperature'"):
        kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=MAX_LEN, learn_temperature=1)
