"""kattn.hf against transformers: softmax equals eager attention in every family; performer
and nprf_rpe (decay RPE) run forward and backward; padded keys count nowhere."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ..helpers import assert_close
from .tiny_models import CAUSAL, FAMILIES, inputs, make, output

hf = pytest.importorskip("kattn.hf")


@pytest.mark.parametrize("family", FAMILIES)
def test_softmax_equals_eager(family: str) -> None:
    model = make(family).double()
    batch = inputs(family)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = output(model, batch)
    hf.use(model, "softmax")
    assert model.config._attn_implementation == "kattn:softmax"
    with torch.no_grad():
        got = output(model, batch)
    assert (got - expected).abs().max() <= 1e-6


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "vit"])
def test_softmax_equals_eager_with_padding(family: str) -> None:
    """Right padding (no query row sees only padding, where eager gives NaN in float64).
    The bound is 1e-6, not ~1e-15: some eager paths take the softmax in float32."""
    model = make(family).double()
    batch = inputs(family)
    mask = torch.ones_like(batch["input_ids"])
    mask[0, -4:] = 0
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = output(model, batch, attention_mask=mask)
    hf.use(model, "softmax")
    with torch.no_grad():
        got = output(model, batch, attention_mask=mask)
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max() <= 1e-6


def test_gpt2_scaling_by_layer_is_honoured() -> None:
    """GPT-2's scale_attn_by_inverse_layer_idx changes HF's scaling per layer."""
    model = make("gpt2", scale_attn_by_inverse_layer_idx=True).double()
    batch = inputs("gpt2")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = output(model, batch)
    hf.use(model, "softmax")
    scales = [m.kattn.scale for m in hf.attention_modules(model)]
    assert scales[0] is None and scales[1] == pytest.approx(8**-0.5 / 2)
    with torch.no_grad():
        assert (output(model, batch) - expected).abs().max() <= 1e-6


@pytest.mark.parametrize("mechanism", ["linear", "nprf_rpe", "ffk_glu"])
def test_a_kernel_whose_scale_equals_the_models_keeps_it(mechanism: str) -> None:
    """GPT-2 without scale_attn_weights scales layer 0 by 1.0, the scale of these kernels:
    that does not make them follow the scaling a call passes."""
    with pytest.warns(UserWarning, match="kernel of its own"):
        model = hf.use(make("gpt2", scale_attn_weights=False), mechanism)
    module = hf.attention_modules(model)[0]
    assert module.scaling == 1.0 and module.kattn.scale == 1.0
    assert not module._kattn_follows_scaling
    q = torch.randn(1, 4, 3, 8, generator=torch.Generator().manual_seed(0))
    hf.attention_forward(module, q, q, q, None, scaling=0.25, is_causal=True)
    assert module.kattn.scale == 1.0


def test_a_softmax_like_scale_takes_the_models_from_one_build() -> None:
    """The model's scaling is set on the kattn module built once: the random features are
    those drawn for a model with softmax's scaling."""
    plain = hf.use(make("gpt2"), "performer", num_features=8)
    unscaled = hf.use(make("gpt2", scale_attn_weights=False), "performer", num_features=8)
    for a, b in zip(hf.attention_modules(plain), hf.attention_modules(unscaled), strict=True):
        assert b._kattn_follows_scaling and b.kattn.scale == 1.0
        assert a.kattn.scale == pytest.approx(8**-0.5)
        for (name, x), (_, y) in zip(
            a.kattn.state_dict().items(), b.kattn.state_dict().items(), strict=True
        ):
            assert torch.equal(x, y), name


def test_a_scale_option_must_be_the_scaling_the_model_applies() -> None:
    """OPT scales its queries and calls attention with scaling 1.0: scale=1.0 is its own
    scaling (softmax equals eager), while Llama's 1/sqrt(8) refuses it."""
    opt = make("opt").double()
    batch = inputs("opt")
    opt.set_attn_implementation("eager")
    with torch.no_grad():
        expected = output(opt, batch)
        got = output(hf.use(opt, "softmax", scale=1.0), batch)
    assert (got - expected).abs().max() <= 1e-6
    llama = hf.use(make("llama"), "softmax", scale=1.0)
    with pytest.raises(NotImplementedError, match="scale: the option sets 1"):
        output(llama, inputs("llama"))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "mechanism, options",
    [("performer", {"num_features": 16}), ("nprf_rpe", {"rpe": "decay", "num_features": 16})],
    ids=["performer", "nprf_rpe-decay"],
)
def test_forward_backward(family: str, mechanism: str, options: dict) -> None:
    model = make(family).train()
    hf.use(model, mechanism, **options)
    keys = [k for k in model.state_dict() if ".kattn." in k]
    assert any(k.endswith("feature_map.projection") for k in keys)
    assert len(hf.attention_modules(model)) == 2
    # BERT, RoBERTa and GPT-2 drop attention weights (0.1); a kernelized sum has none
    dropping = family in ("bert", "roberta", "gpt2")
    warns = pytest.warns(UserWarning, match="dropout .* is not applied")
    with warns if dropping else contextlib.nullcontext():
        out = output(model, inputs(family))
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "query" in n or "q_proj" in n]
    grads += [p.grad for n, p in model.named_parameters() if "c_attn" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    if mechanism == "nprf_rpe":
        rpe = [p for n, p in model.named_parameters() if n.endswith("kattn.rpe.log_alpha")]
        assert len(rpe) == 2 and all(p.grad is not None for p in rpe)


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("mechanism", ["performer", "nprf_rpe"])
def test_padded_keys_count_nowhere(family: str, mechanism: str) -> None:
    """Changing the ids of padded tokens leaves every other output unchanged."""
    model = make(family).double()
    hf.use(model, mechanism, **({"rpe": "decay"} if mechanism == "nprf_rpe" else {}))
    batch = inputs(family)
    mask = torch.ones_like(batch["input_ids"])
    pad = slice(0, 4) if family in CAUSAL else slice(-4, None)  # left padding for decoders
    mask[0, pad] = 0
    other = batch["input_ids"].clone()
    other[0, pad] = (other[0, pad] + 17) % 100
    with torch.no_grad():
        a = output(model, batch, attention_mask=mask)
        b = output(model, {"input_ids": other}, attention_mask=mask)
    real = mask.bool()
    assert_close(a[real], b[real])
    if family == "bert":  # the padded positions' own outputs do change: the test can fail
        assert not torch.allclose(a[~real], b[~real])


def test_grouped_query_heads_are_repeated() -> None:
    """Llama with 4 query heads sharing 2 key/value heads: the kattn module has 4 heads and
    softmax equals eager (checked above); here the repeat is HF's own repeat_kv."""
    from transformers.integrations.sdpa_attention import repeat_kv

    from kattn.hf.attention import _repeat_kv

    x = torch.randn(2, 2, 5, 3)
    assert torch.equal(_repeat_kv(x, 4), repeat_kv(x, 2))
    model = make("llama")
    hf.use(model, "performer")
    assert {m.kattn.num_heads for m in hf.attention_modules(model)} == {4}
    assert {m.kattn.max_len for m in hf.attention_modules(model)} == {64}
