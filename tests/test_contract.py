"""The public contract of DESIGN.md §3, held over every registered mechanism.

These tests iterate ``kattn.available()``, so a mechanism is held to the contract the moment it
is registered: shapes and dtypes, evaluation without randomness, cross-attention, causality,
padding, recurrent decoding, gradients, half precision, refusals of bad input, ``state_dict``
round trips, the drop-in ``MultiheadAttention``, ``patch`` and every feature map. A capability
that a mechanism's flags rule out must be refused, never silently ignored.
"""

from __future__ import annotations

import pytest
import torch

import kattn

from .helpers import grads, padding_mask, step_through

MECHANISMS = kattn.available()
FLAGS = ("supports_causal", "supports_padding_mask", "supports_cross", "supports_recurrent")
B, H, D, DV, LENGTH, MAX_LEN = 2, 2, 12, 6, 29, 48
PADS = (4, 9)  # padded keys at the end of row 0 and row 1


def make(name: str, *, seed: int = 0, **options) -> kattn.Attention:
    """The mechanism in evaluation mode, its random parts drawn from ``seed``."""
    torch.manual_seed(seed)
    return kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **options).eval()


def inputs(lq: int = LENGTH, lk: int | None = None, *, scale: float = 1.0, seed: int = 3):
    lk = lq if lk is None else lk
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(B, H, lq, D, generator=g)
    k = scale * torch.randn(B, H, lk, D, generator=g)
    v = torch.randn(B, H, lk, DV, generator=g)
    return q, k, v


def call(attn: kattn.Attention, *args, rng: int = 11, **kwargs) -> torch.Tensor:
    """Call with the global RNG at a known state (mechanisms that draw in training use it)."""
    torch.manual_seed(rng)
    return attn(*args, **kwargs)


def same(a: torch.Tensor, b: torch.Tensor, *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", MECHANISMS)
def test_spec_flags_are_the_built_modules_flags(name):
    spec, attn = kattn.spec(name), make(name)
    assert spec.summary.strip() and spec.complexity.strip() and spec.reference.strip()
    for flag in (*FLAGS, "is_exact"):
        assert getattr(spec, flag) is getattr(attn, flag), flag


@pytest.mark.parametrize("name", MECHANISMS)
def test_output_has_the_value_shape_and_the_input_dtype(name):
    out = call(make(name), *inputs())
    assert out.shape == (B, H, LENGTH, DV) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", MECHANISMS)
def test_evaluation_does_not_depend_on_the_global_rng(name):
    attn, qkv = make(name), inputs()
    torch.testing.assert_close(call(attn, *qkv, rng=1), call(attn, *qkv, rng=2), rtol=0, atol=0)


@pytest.mark.parametrize("name", MECHANISMS)
def test_cross_attention_or_a_clear_refusal(name):
    attn, qkv = make(name), inputs(lq=13, lk=LENGTH)
    if attn.supports_cross:
        out = call(attn, *qkv)
        assert out.shape == (B, H, 13, DV) and torch.isfinite(out).all()
    else:
        with pytest.raises((NotImplementedError, ValueError)):
            call(attn, *qkv)


@pytest.mark.parametrize("name", MECHANISMS)
def test_causal_outputs_ignore_every_later_token(name):
    attn, (q, k, v) = make(name), inputs()
    if not attn.supports_causal:
        with pytest.raises(NotImplementedError):
            call(attn, q, k, v, causal=True)
        return
    cut = 17
    g = torch.Generator().manual_seed(8)
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:  # large new values after the cut: a leaking stabiliser would show
        x[:, :, cut:] = 8 * torch.randn(x[:, :, cut:].shape, generator=g)
    same(
        call(attn, q, k, v, causal=True)[:, :, :cut], call(attn, *changed, causal=True)[:, :, :cut]
    )
    with pytest.raises(ValueError):
        call(attn, *inputs(lq=13, lk=LENGTH), causal=True)


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_keys_and_values_never_count(name, causal):
    attn, (q, k, v) = make(name), inputs()
    mask = padding_mask(B, LENGTH, PADS)
    if not attn.supports_padding_mask:
        with pytest.raises(NotImplementedError):
            call(attn, q, k, v, key_padding_mask=mask)
        return
    if causal and not attn.supports_causal:
        return
    g = torch.Generator().manual_seed(4)
    where = mask[:, None, :, None]
    k2 = torch.where(where, 25 * torch.randn(k.shape, generator=g), k)
    v2 = torch.where(where, 25 * torch.randn(v.shape, generator=g), v)
    out = call(attn, q, k, v, causal=causal, key_padding_mask=mask)
    out2 = call(attn, q, k2, v2, causal=causal, key_padding_mask=mask)
    keep = ~mask
    for row in range(B):  # the outputs at padded positions are anyone's
        same(out[row][:, keep[row]], out2[row][:, keep[row]])


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_and_inf_in_padded_keys_and_values_change_nothing(name, causal):
    """Padded keys count nowhere, not even through 0 × NaN."""
    attn, (q, k, v) = make(name), inputs()
    if not attn.supports_padding_mask or (causal and not attn.supports_causal):
        return
    mask = padding_mask(B, LENGTH, PADS)
    where = mask[:, None, :, None]
    poison = torch.full((), float("nan")), torch.full((), float("inf"))
    k2, v2 = torch.where(where, poison[0], k), torch.where(where, -poison[1], v)
    out = call(attn, q, k, v, causal=causal, key_padding_mask=mask)
    out2 = call(attn, q, k2, v2, causal=causal, key_padding_mask=mask)
    keep = ~mask
    for row in range(B):
        assert torch.isfinite(out2[row][:, keep[row]]).all()
        same(out[row][:, keep[row]], out2[row][:, keep[row]])


@pytest.mark.parametrize("name", MECHANISMS)
def test_a_row_with_every_key_padded_stays_finite(name):
    attn = make(name)
    if not attn.supports_padding_mask:
        return
    mask = padding_mask(B, LENGTH, (0, LENGTH))
    q, k, v = (x.requires_grad_() for x in inputs())
    out = call(attn, q, k, v, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    for g in grads(out, q, k, v):  # and so are the gradients through it
        assert g is None or torch.isfinite(g).all()


@pytest.mark.parametrize("name", MECHANISMS)
def test_decoding_token_by_token_equals_the_causal_forward(name):
    attn = make(name).double()
    if not attn.supports_recurrent:
        assert not kattn.spec(name).supports_recurrent
        return
    q, k, v = (x.double() for x in inputs())
    state = attn.init_state(B, H, device=q.device, dtype=q.dtype)
    steps, _ = step_through(attn.step, q, k, v, state)
    same(steps, call(attn, q, k, v, causal=True), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", MECHANISMS)
def test_training_gradients_are_finite_and_reach_the_values(name):
    attn = make(name).train()
    q, k, v = (x.requires_grad_() for x in inputs())
    loss = call(attn, q, k, v).pow(2).mean() + attn.regularization_loss()
    loss.backward()
    for x in (q, k, v):
        assert x.grad is not None and torch.isfinite(x.grad).all()
    assert v.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", MECHANISMS)
def test_bfloat16_inputs_give_a_close_bfloat16_output(name):
    attn = make(name)
    rounded = [x.bfloat16() for x in inputs(scale=1.5)]
    exact = call(attn, *(x.float() for x in rounded))
    out = call(attn, *rounded)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.float() - exact).norm() / exact.norm().clamp_min(1e-6) < 0.05


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_query_and_key_norms_stay_finite(name, causal):
    attn = make(name)
    if causal and not attn.supports_causal:
        return
    assert torch.isfinite(call(attn, *inputs(scale=15.0), causal=causal)).all()


@pytest.mark.parametrize("name", MECHANISMS)
def test_malformed_inputs_raise_value_errors(name):
    attn, (q, k, v) = make(name), inputs()
    cases = {
        "3-d query": (q[0], k, v, {}),
        "batch": (q, k[1:], v[1:], {}),
        "heads": (q, k[:, :1], v[:, :1], {}),
        "key/value length": (q, k, v[:, :, 1:], {}),
        "head dim": (q, k[..., 1:], v, {}),
    }
    if attn.supports_padding_mask:
        cases["mask length"] = (q, k, v, {"key_padding_mask": torch.zeros(B, LENGTH - 1).bool()})
        cases["mask dtype"] = (q, k, v, {"key_padding_mask": torch.zeros(B, LENGTH)})
    for case, (*args, kwargs) in cases.items():
        with pytest.raises(ValueError):
            call(attn, *args, **kwargs)
            pytest.fail(f"{case}: accepted")


@pytest.mark.parametrize("name", MECHANISMS)
def test_unknown_options_are_type_errors(name):
    with pytest.raises(TypeError, match="no_such_option"):
        kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, no_such_option=True)


@pytest.mark.parametrize("name", MECHANISMS)
def test_a_loaded_state_dict_reproduces_the_outputs(name):
    source, target = make(name, seed=0), make(name, seed=123)
    target.load_state_dict(source.state_dict())
    qkv = inputs()
    torch.testing.assert_close(call(source, *qkv), call(target, *qkv), rtol=0, atol=0)


@pytest.mark.parametrize("name", MECHANISMS)
def test_multihead_attention_is_a_drop_in_module(name):
    torch.manual_seed(0)
    mha = kattn.MultiheadAttention(16, 2, mechanism=name, max_len=MAX_LEN).eval()
    x = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(2))
    out, weights = mha(x, x, x, need_weights=False)
    assert weights is None and out.shape == x.shape and torch.isfinite(out).all()


def _encoder() -> torch.nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=24, dropout=0.0, batch_first=True
    )
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def test_patching_with_softmax_keeps_the_model_and_drops_torchs_module():
    model = _encoder()
    x = torch.randn(2, 15, 16, generator=torch.Generator().manual_seed(1))
    mask = padding_mask(2, 15, (0, 5))
    with torch.no_grad():
        before = model(x, src_key_padding_mask=mask)
        kattn.patch(model, mechanism="softmax")
        after = model(x, src_key_padding_mask=mask)
    assert all(type(m) is not torch.nn.MultiheadAttention for m in model.modules())
    same(after[~mask], before[~mask])


def test_patching_with_another_mechanism_changes_what_runs():
    model = _encoder()
    x = torch.randn(2, 15, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x)
        kattn.patch(model, mechanism="linear")
        assert (model(x) - before).abs().max() > 1e-3


@pytest.mark.parametrize("feature_map", kattn.features.available())
def test_every_feature_map_runs_inside_kernelized_attention(feature_map):
    attn = make("kernelized", feature_map=feature_map)
    out = call(attn, *inputs(), causal=attn.supports_causal)
    assert out.shape == (B, H, LENGTH, DV) and torch.isfinite(out).all()
