"""Feed-forward kernels (Yorsh 2022, §4.1): formulas against hand-written references,
gradients, positivity, recurrent steps, per-head weights, options; the regularisers are in
``test_feedforward_regularisers.py``."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kattn

from ..helpers import assert_close, grads, padding_mask, qkv, step_through
from .feedforward_helpers import (
    NAMES,
    D,
    H,
    build_attention,
    build_map,
    dense_attention,
    reference_features,
    two_layers,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"


# ---------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_attention_equals_dense_reference(name, causal):
    attn = build_attention(name, train=name != "ffk_vae", num_features=D + 4, **two_layers(name))
    fm = attn.feature_map
    q, k, v = qkv(h=H, d=D, lq=29, requires_grad=True)
    mask = None if causal else padding_mask(2, 29, (0, 6))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = dense_attention(
        reference_features(fm, name, q),
        reference_features(fm, name, k),
        v,
        causal=causal,
        key_padding_mask=mask,
    )
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_num_features_scale_and_dtypes(name):
    fm = build_map(name).eval()
    x = torch.randn(2, H, 5, D, dtype=torch.float64)
    assert fm.num_features == D and fm(x).values.shape == (2, H, 5, D) and fm(x).log_scale is None
    assert_close(fm.features(x, scale=4.0), fm.features(2 * x))
    wide = build_map(name, num_features=24).eval()
    assert wide.num_features == 24 and wide.features(x).shape == (2, H, 5, 24)
    fp32 = kattn.features.build(name, head_dim=D, num_heads=H).eval()
    assert fp32(x).values.dtype == torch.float64  # fp32 parameters, fp64 maths
    assert fp32.half()(x.float()).values.dtype == torch.float32


def test_defaults_follow_the_thesis():
    expected = {
        "ffk_linear": 0.1,
        "ffk_fcnn": 0.1,
        "ffk_glu": 0.0,
        "ffk_oglu": 0.1,
        "ffk_aoglu": 0.1,
        "ffk_ae": 0.0,
        "ffk_vae": 0.0,
    }
    for name, penalty in expected.items():
        fm = build_map(name)
        assert fm.orthogonal_penalty == penalty, name
        assert not fm.approximates_softmax and fm.positive
    attn = kattn.build("kernelized", feature_map="ffk_linear", head_dim=D, num_heads=H)
    assert attn.scale == 1.0
    # AOGLU: r = d/4, a quarter fewer parameters than GLU (Yorsh 2022, §4.3.2.1)
    glu, aoglu = build_map("ffk_glu"), build_map("ffk_aoglu")
    assert aoglu.gate_rank == D // 4 and aoglu.layers[0].gate_up.shape == (H, D // 4, D)
    size = sum(p.numel() for p in glu.parameters())
    assert sum(p.numel() for p in aoglu.parameters()) == 0.75 * size
    assert build_map("ffk_aoglu", gate_rank=3).gate_rank == 3
    assert kattn.features.build("ffk_aoglu", head_dim=2, num_heads=1).gate_rank == 1


@pytest.mark.parametrize("name", NAMES)
def test_extra_repr_shows_the_options(name):
    text = repr(build_map(name, num_features=12, orthogonal_penalty=0.25))
    assert "num_features=12" in text and "orthogonal_penalty=0.25" in text


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter(name):
    attn = build_attention(name, train=True, orthogonal_penalty=0.1, **two_layers(name))
    with torch.no_grad():  # leave the orthogonal point, so the penalty has a gradient too
        for p in attn.parameters():
            p.add_(0.05 * torch.randn_like(p))
    q, k, v = qkv(h=H, d=D, lq=11)
    out = attn(q, k, v, causal=True)
    weight = torch.randn_like(out)
    ((out * weight).sum() + attn.regularization_loss()).backward()
    params = dict(attn.named_parameters())
    assert params
    for pname, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


# --------------------------------------------------------------------------- positivity
@pytest.mark.parametrize("name", NAMES)
def test_features_stay_strictly_positive_for_huge_inputs(name):
    torch.manual_seed(0)
    attn = kattn.build("kernelized", feature_map=name, head_dim=D, num_heads=H)
    fm = attn.feature_map
    first = next(fm.parameters()).detach()  # (H, D, ·): the first layer's input weights
    away = -F.normalize(first.sum(-1), dim=-1)  # (H, D): negative projections on every column
    x = torch.cat(
        [
            1e3 * away[None, :, None, :].expand(2, H, 3, D),
            1e3 * F.normalize(torch.randn(2, H, 5, D), dim=-1),
        ],
        dim=2,
    )
    modes = [False] if name == "ffk_vae" else [False, True]  # vae: σ = exp(x W_s / 2) overflows
    for train in modes:
        fm.train(train)
        values = fm(x).values
        assert values.dtype == torch.float32
        assert torch.isfinite(values).all() and (values > 0).all()
        assert (values == torch.finfo(torch.float32).tiny).any()  # the clamp did act
        out = attn.train(train)(x, x, torch.randn(2, H, 8, 4))
        assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------- recurrent
@pytest.mark.parametrize("name", ["ffk_oglu", "ffk_ae"])
def test_causal_forward_equals_recurrent_steps(name):
    attn = build_attention(name, **two_layers(name))
    q, k, v = qkv(h=H, d=D, lq=13)
    full = attn(q, k, v, causal=True)
    steps, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=torch.float64))
    assert_close(steps, full)


# --------------------------------------------------------------------------- per head
@pytest.mark.parametrize("name", NAMES)
def test_each_head_has_its_own_weights(name):
    fm = build_map(name, **two_layers(name)).eval()
    for pname, p in fm.named_parameters():
        assert p.shape[0] == H, pname
        assert (p[0] - p[1]).abs().max() > 1e-3, pname
    x = torch.randn(1, 1, 4, D, dtype=torch.float64).expand(1, H, 4, D)
    values = fm.features(x)
    assert (values[:, 0] - values[:, 1]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="H=3"):
        fm(torch.randn(1, 1, 4, D, dtype=torch.float64))


# ------------------------------------------------------------------------------ options
@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_refused(name):
    with pytest.raises(TypeError, match="surely_not"):
        kattn.features.build(name, head_dim=D, num_heads=H, surely_not=1)
    with pytest.raises(TypeError, match="surely_not"):
        kattn.build("kernelized", feature_map=name, head_dim=D, num_heads=H, surely_not=1)


BAD_VALUES = [
    ("num_features", 0),
    ("num_features", 2.0),
    ("num_features", True),
    ("orthogonal_penalty", -0.1),
    ("orthogonal_penalty", float("nan")),
    ("orthogonal_penalty", float("inf")),
    ("orthogonal_penalty", "0.1"),
]


@pytest.mark.parametrize(("option", "value"), BAD_VALUES, ids=lambda x: repr(x))
@pytest.mark.parametrize("name", NAMES)
def test_bad_common_options_raise(name, option, value):
    # a value of the wrong type is refused by the registry's type check, as by kattn.build
    error = TypeError if isinstance(value, str) else ValueError
    with pytest.raises(error, match=option):
        kattn.features.build(name, head_dim=D, num_heads=H, **{option: value})


@pytest.mark.parametrize(
    ("name", "option", "value"),
    [
        ("ffk_fcnn", "depth", 0),
        ("ffk_glu", "depth", -1),
        ("ffk_aoglu", "depth", 1.5),
        ("ffk_glu", "gate_rank", 0),
        ("ffk_aoglu", "gate_rank", 0),
        ("ffk_oglu", "gate_rank", False),
        ("ffk_ae", "reconstruction_weight", -1.0),
        ("ffk_vae", "reconstruction_weight", float("nan")),
        ("ffk_vae", "kl_weight", -0.5),
        ("ffk_vae", "kl_weight", float("inf")),
    ],
    ids=lambda x: repr(x),
)
def test_bad_specific_options_raise(name, option, value):
    with pytest.raises(ValueError, match=option):
        kattn.features.build(name, head_dim=D, num_heads=H, **{option: value})


def test_option_names():
    assert kattn.features.option_names("ffk_linear") == ["num_features", "orthogonal_penalty"]
    assert set(kattn.features.option_names("ffk_aoglu")) == {
        "num_features",
        "depth",
        "gate_rank",
        "orthogonal_penalty",
    }
    assert "kl_weight" in kattn.features.option_names("ffk_vae")
    assert "kl_weight" not in kattn.features.option_names("ffk_ae")


# --------------------------------------------------------------------------------- docs
