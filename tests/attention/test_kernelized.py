"""Kernelized attention modules: equal to the composed reference, estimate softmax, recurrent."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import kattn
from kattn.functional import linear_attention_reference, softmax_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

D, H = 16, 3
MAPS = ["elu", "relu", "identity", "prf", "trf"]


def build(name="kernelized", **options):
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=H, **options).double().eval()


def reference(attn, q, k, v, **kwargs):
    """Explicit features, explicit (Lq, Lk) kernel matrix."""
    fq = attn.features(q).dense()
    fk = attn.features(k).dense()
    return linear_attention_reference(fq, fk, v, eps=attn.eps, **kwargs)


@pytest.mark.parametrize("feature_map", MAPS)
@pytest.mark.parametrize("causal", [False, True])
def test_module_equals_composed_reference(feature_map, causal):
    attn = (
        build(feature_map=feature_map, num_features=32)
        if feature_map in ("prf", "trf")
        else build(feature_map=feature_map)
    )
    q, k, v = qkv(lq=41, d=D, scale=0.5, requires_grad=True)
    mask = padding_mask(2, 41, (0, 7))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = reference(attn, q, k, v, causal=causal, key_padding_mask=mask)
    keep = ~mask  # rows of fully valid queries (identity/trf normalisers may cross zero elsewhere)
    assert_close(
        out[:, :, :][keep[:, None, :].expand(-1, H, -1)], ref[keep[:, None, :].expand(-1, H, -1)]
    )
    if feature_map in ("elu", "prf"):  # positive maps: smooth everywhere, compare gradients
        for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
            assert_close(a, b)


def test_cross_attention_equals_reference():
    attn = build("performer", num_features=32)
    q, k, v = qkv(lq=9, lk=30, d=D)
    assert_close(attn(q, k, v), reference(attn, q, k, v))


def test_performer_error_falls_as_features_grow():
    """On small-norm inputs the error against exact softmax falls like 1/√M (Luo et al. 2021,
    §3.3)."""
    errors = []
    for m in (16, 64, 256, 1024):
        per_seed = []
        for seed in range(5):
            q, k, v = qkv(b=1, h=4, lq=128, d=D, dv=16, scale=0.5, seed=seed)
            torch.manual_seed(100 + seed)
            attn = kattn.build("performer", head_dim=D, num_heads=4, num_features=m).double()
            exact = softmax_attention_reference(q, k, v)
            per_seed.append(((attn.eval()(q, k, v) - exact).norm() / exact.norm()).item())
        errors.append(sum(per_seed) / len(per_seed))
    assert all(a > b for a, b in itertools.pairwise(errors)), errors
    assert errors[-1] < 0.12, errors
    assert errors[0] / errors[-1] > 3.0, errors  # 1/√M predicts 8


def test_default_scales():
    assert build("performer").scale == pytest.approx(D**-0.5)
    assert build("rfa").scale == pytest.approx(D**-0.5)
    assert build("linear").scale == 1.0
    assert build("performer", normalize_qk=True).scale == 1.0
    assert build("performer", scale=0.5).scale == 0.5


def test_normalize_qk_is_scale_invariant():
    attn = build("performer", normalize_qk=True, num_features=32)
    q, k, v = qkv(d=D)
    assert_close(attn(q, k, v), attn(q * 7.0, k * 0.1, v))
    unit = reference(attn, F.normalize(q, dim=-1), F.normalize(k, dim=-1), v)
    assert_close(attn(q, k, v), unit)


@pytest.mark.parametrize("feature_map", MAPS)
def test_recurrent_steps_equal_causal_forward(feature_map):
    attn = build(feature_map=feature_map)
    q, k, v = qkv(lq=23, d=D, scale=0.5)
    full = attn(q, k, v, causal=True)
    steps, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=q.dtype))
    assert_close(steps, full)


@pytest.mark.parametrize("name", ["performer", "rfa", "linear"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_large_norms_stay_finite(name, causal, dtype):
    """‖q‖ = ‖k‖ = 50: finite outputs and gradients, in fp32 and half precision."""
    torch.manual_seed(0)
    options = {} if name == "linear" else {"num_features": 64}
    attn = kattn.build(name, head_dim=64, num_heads=2, **options)
    q, k, v = qkv(h=2, lq=33, d=64, dv=8, dtype=torch.float32)
    q = (F.normalize(q, dim=-1) * 50).to(dtype).requires_grad_()
    k = (F.normalize(k, dim=-1) * 50).to(dtype).requires_grad_()
    v = v.to(dtype).requires_grad_()
    out = attn(q, k, v, causal=causal)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads(out.float(), q, k, v))


@pytest.mark.parametrize("feature_map", MAPS)
def test_future_tokens_leave_earlier_outputs_bitwise_unchanged(feature_map):
    attn = build(feature_map=feature_map).float()
    q, k, v = qkv(lq=150, d=D, dtype=torch.float32)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, :, 100:] = torch.randn_like(x[:, :, 100:]) * 40
    a = attn(q, k, v, causal=True)
    b = attn(q2, k2, v2, causal=True)
    assert torch.equal(a[:, :, :100], b[:, :, :100])


def test_chunk_and_block_sizes_do_not_change_results():
    q, k, v = qkv(lq=70, d=D)
    outs = [
        build("performer", num_features=32, chunk_size=c, block_size=b)(q, k, v, causal=True)
        for c, b in ((1, 1), (7, 20), (64, 4096), (128, 128))
    ]
    for out in outs[1:]:
        assert_close(out, outs[0])


def test_options_are_validated():
    for bad in ({"chunk_size": 0}, {"block_size": -2}, {"eps": 0.0}, {"scale": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            kattn.build("performer", head_dim=D, num_heads=H, **bad)
    with pytest.raises(TypeError, match="feature_map"):
        kattn.build("kernelized", head_dim=D, num_heads=H, feature_map=torch.nn.Identity())


def test_regularization_loss_is_zero_without_learned_parts():
    loss = build("performer").regularization_loss()
    assert loss.shape == () and loss.item() == 0.0


def test_performer_on_unit_sphere_inputs_matches_softmax_closely():
    """Seed 000 Fig. 1b regime: unit-norm q/k, many features → small error (NPRF's premise)."""
    q, k, v = qkv(b=1, h=1, lq=64, d=D)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    torch.manual_seed(1)
    attn = kattn.build("performer", head_dim=D, num_heads=1, num_features=1024, scale=1.0).double()
    exact = softmax_attention_reference(q, k, v, scale=1.0)
    assert ((attn(q, k, v) - exact).norm() / exact.norm()).item() < 0.1
