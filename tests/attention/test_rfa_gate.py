"""rfa_gate: the registration and defaults, forward against the dense reference (forward and
gradients of q, k, v and the gate), any feature map, steps and prefill against the causal
forward, what the gate does at its extremes, padding (NaN keys), no future leak, random features
(fixed in eval, redrawn in training), half precision and autocast, refusals."""

from __future__ import annotations

import math

import pytest
import torch

import kattn
from kattn.attention.rfa_gate import GatedRandomFeatureAttention

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

D, H, DV = 16, 3, 8


def build(seed: int = 0, **options) -> GatedRandomFeatureAttention:
    torch.manual_seed(seed)
    attn = kattn.build("rfa_gate", head_dim=D, num_heads=H, **options)
    assert isinstance(attn, GatedRandomFeatureAttention)
    return attn


def test_registration_and_defaults():
    spec = kattn.spec("rfa_gate")
    assert spec.supports_causal and spec.supports_padding_mask and spec.supports_recurrent
    assert not spec.supports_cross and not spec.is_exact
    assert spec.approximates is None  # the gate re-weights keys: no softmax estimate
    attn = build()
    assert attn.feature_map_name == "trf" and attn.feature_map.num_features == 256
    assert attn.scale == pytest.approx(D**-0.5)
    assert attn.gate_weight.shape == (H, D) and attn.gate_bias.shape == (H,)
    assert torch.equal(attn.gate_bias, torch.zeros(H))
    bound = math.sqrt(6 / (D + 1))
    assert 0.5 * bound < attn.gate_weight.abs().max() <= bound
    assert float(attn.regularization_loss()) == 0.0
    assert build(gate_bias=3.0).gate_bias.detach().tolist() == [3.0] * H


@pytest.mark.parametrize(
    ("causal", "pads"),
    [(True, None), (True, (0, 5)), (False, None), (False, (4, 0))],
    ids=["causal", "causal-pad", "bidirectional", "bidirectional-pad"],
)
def test_forward_equals_the_dense_reference(causal, pads):
    attn = build(chunk_size=8, block_size=16, num_features=12).double()
    q, k, v = qkv(2, H, 37, d=D, dv=DV, requires_grad=True)
    mask = None if pads is None else padding_mask(2, 37, pads)
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    tensors = [q, k, v, attn.gate_weight, attn.gate_bias]
    for fast, slow in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        torch.testing.assert_close(fast, slow, rtol=1e-8, atol=1e-10)
        assert slow.abs().max() > 0  # the gate's parameters get a gradient too


@pytest.mark.parametrize("feature_map", kattn.features.available())
def test_every_feature_map(feature_map):
    attn = build(feature_map=feature_map, chunk_size=4).double().eval()
    q, k, v = qkv(1, H, 13, d=D, dv=DV)
    for causal in (True, False):
        out = attn(q, k, v, causal=causal)
        assert_close(out, attn.reference(q, k, v, causal=causal))


def test_steps_and_prefill_continue_the_causal_forward():
    attn = build(chunk_size=4).double().eval()
    q, k, v = qkv(2, H, 29, d=D, dv=DV)
    expected = attn(q, k, v, causal=True)
    first, state = attn.prefill(q[:, :, :11], k[:, :, :11], v[:, :, :11])
    rest, state = step_through(attn.step, q, k, v, state, start=11)
    assert_close(torch.cat([first, rest], dim=2), expected)
    num_features = attn.feature_map.num_features
    assert state.kv.shape == (2, H, num_features, DV)  # O(M·Dv) per head, whatever the length


def test_closed_gates_return_each_tokens_own_value():
    # g = σ(−40) ≈ 0: the state holds the current token only, so out_t = v_t (the paper's
    # recency bias at its extreme)
    attn = build(gate_bias=-40.0, feature_map="prf").double()
    with torch.no_grad():
        attn.gate_weight.zero_()
    q, k, v = qkv(2, H, 21, d=D, dv=DV)
    assert_close(attn(q, k, v, causal=True), v)


def test_open_gates_give_ungated_random_feature_attention():
    # g = σ(25) = 1 − 1.4e-11: every key keeps weight (1 − g) g^(i−j), the same for all keys
    # up to 1e-9, so the output is RFA's (the same random features) to that precision
    attn = build(gate_bias=25.0).double()
    with torch.no_grad():
        attn.gate_weight.zero_()
    rfa = kattn.build("rfa", head_dim=D, num_heads=H).double()
    rfa.feature_map.load_state_dict(attn.feature_map.state_dict())
    q, k, v = qkv(2, H, 33, d=D, dv=DV)
    for causal in (True, False):
        torch.testing.assert_close(
            attn(q, k, v, causal=causal), rfa(q, k, v, causal=causal), rtol=1e-6, atol=1e-7
        )


def test_the_gate_reads_the_keys():
    attn = build(feature_map="prf").double()
    q, k, v = qkv(1, H, 17, d=D, dv=DV)
    logits = attn.gate_logits(k)
    expected = torch.einsum("bhld,hd->bhl", k, attn.gate_weight) + attn.gate_bias[:, None]
    assert_close(logits, expected)
    with torch.no_grad():
        attn.gate_weight.mul_(3.0)  # other gates, other outputs
    assert (attn(q, k, v, causal=True) - attn.reference(q, k, v, causal=True)).abs().max() < 1e-9
    before = build(feature_map="prf").double()(q, k, v, causal=True)
    assert (attn(q, k, v, causal=True) - before).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_nan_in_padded_keys_and_values_counts_nowhere(causal):
    attn = build(chunk_size=8)
    q, k, v = qkv(2, H, 30, d=D, dv=DV, dtype=torch.float32)
    mask = padding_mask(2, 30, (0, 7))
    mask[0, 3] = True
    k2, v2 = k.clone(), v.clone()
    pad = mask[:, None, :].expand(2, H, 30)
    k2[pad], v2[pad] = float("nan"), float("nan")
    k2.requires_grad_()
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    out2 = attn(q, k2, v2, causal=causal, key_padding_mask=mask)
    assert torch.equal(out, out2)
    out2.square().sum().backward()
    assert torch.isfinite(k2.grad).all() and torch.isfinite(attn.gate_weight.grad).all()
    assert (k2.grad[pad] == 0).all()


def test_future_tokens_change_no_earlier_output():
    attn = build(chunk_size=8)
    q, k, v = qkv(2, H, 40, d=D, dv=DV, dtype=torch.float32)
    t = 19
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 20
    out, out2 = attn(q, k, v, causal=True), attn(q2, k2, v2, causal=True)
    assert torch.equal(out[:, :, : t + 1], out2[:, :, : t + 1])
    assert not torch.equal(out[:, :, t + 1 :], out2[:, :, t + 1 :])


def test_random_features_are_fixed_in_eval_and_redrawn_in_training():
    attn = build(redraw=1)
    q, k, v = qkv(1, H, 9, d=D, dv=DV, dtype=torch.float32)
    attn.eval()
    assert torch.equal(attn(q, k, v, causal=True), attn(q, k, v, causal=True))
    projection = attn.feature_map.projection.clone()
    attn.train()(q, k, v, causal=True)
    assert not torch.equal(attn.feature_map.projection, projection)
    assert "feature_map.projection" in attn.state_dict()


def test_large_norms_in_float32_match_float64():
    attn = build()
    q, k, v = qkv(2, H, 50, d=D, dv=DV, scale=12.0)  # key log-scales in the hundreds
    for causal in (True, False):
        exact = attn.double()(q, k, v, causal=causal)
        out = attn.float()(q.float(), k.float(), v.float(), causal=causal)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, exact.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    attn = build(feature_map="prf")
    q, k, v = (x.to(dtype) for x in qkv(2, H, 37, d=D, dv=DV))
    for causal in (True, False):
        out = attn(q, k, v, causal=causal)
        exact = attn(q.float(), k.float(), v.float(), causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out, exact)


def test_bf16_autocast_leaves_outputs_unchanged():
    attn = build(feature_map="prf")
    q, k, v = qkv(2, H, 40, d=D, dv=DV, dtype=torch.float32)
    for causal in (True, False):
        exact = attn(q, k, v, causal=causal)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(q, k, v, causal=causal)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, exact)


def test_refusals_are_sentences():
    attn = build()
    q, k, v = qkv(1, H, 9, 12, d=D, dv=DV, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="pairing query i with key i"):
        attn(q, k, v)
    with pytest.raises(ValueError, match="causal attention needs Lq == Lk"):
        attn(q, k, v, causal=True)
    with pytest.raises(TypeError, match="surely_not"):
        kattn.build("rfa_gate", head_dim=D, num_heads=H, surely_not=1)
    with pytest.raises(ValueError, match="gate_bias must be finite"):
        kattn.build("rfa_gate", head_dim=D, num_heads=H, gate_bias=float("nan"))
    with pytest.raises(ValueError, match="chunk_size"):
        kattn.build("rfa_gate", head_dim=D, num_heads=H, chunk_size=0)
    with pytest.raises(ValueError, match="num_heads"):
        attn(*qkv(1, H + 1, 9, d=D, dv=DV, dtype=torch.float32))
