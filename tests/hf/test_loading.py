"""Saving and loading kattn models: the kattn tensors are in state_dict and config.json,
and a saved model comes back exactly through kattn.hf.from_pretrained and through
transformers' own from_pretrained with attn_implementation="kattn:<name>"."""

from __future__ import annotations

import json

import pytest
import torch

from .tiny_models import FAMILIES, inputs, make, output

hf = pytest.importorskip("kattn.hf")
transformers = pytest.importorskip("transformers")

OPTIONS = {"rpe": "decay", "num_features": 16}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(family: str, tmp_path) -> None:
    model = hf.use(make(family), "nprf_rpe", **OPTIONS)
    batch = inputs(family)
    with torch.no_grad():
        expected = output(model, batch)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["kattn"] == {"mechanism": "nprf_rpe", "options": OPTIONS}
    cls = type(model)
    loaded = hf.from_pretrained(cls, str(tmp_path)).eval()
    assert loaded.config._attn_implementation == "kattn:nprf_rpe"
    for key, value in model.state_dict().items():
        if ".kattn." in key:
            assert torch.equal(loaded.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(output(loaded, batch), expected)
    plain = cls.from_pretrained(str(tmp_path), attn_implementation="kattn:nprf_rpe").eval()
    with torch.no_grad():
        assert torch.equal(output(plain, batch), expected)


def test_auto_class_and_training_state(tmp_path) -> None:
    """AutoModelForCausalLM, and the redraw counter of the random features (extra state),
    saved by safetensors as an int64 tensor and restored by both loaders."""
    model = hf.use(make("llama").train(), "performer", num_features=16, redraw=5)
    ids = inputs("llama")["input_ids"]
    for _ in range(3):
        model(ids)
    model.save_pretrained(tmp_path)
    safetensors = pytest.importorskip("safetensors.torch")
    saved = safetensors.load_file(tmp_path / "model.safetensors")
    extra = [v for k, v in saved.items() if k.endswith("kattn.feature_map._extra_state")]
    assert len(extra) == 2 and all(torch.equal(v, torch.tensor([3])) for v in extra)
    loaded = hf.from_pretrained(transformers.AutoModelForCausalLM, str(tmp_path))
    plain = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="kattn:performer"
    )
    for again in (loaded, plain):
        features = [m.kattn.feature_map for m in hf.attention_modules(again)]
        assert [f._steps_since_redraw for f in features] == [3, 3]


def test_a_plain_checkpoint_gets_fresh_kattn_tensors(tmp_path) -> None:
    """A checkpoint saved without kattn: the kattn modules are initialised as when built,
    never left as the uninitialised memory transformers loads missing tensors into."""
    make("llama").save_pretrained(tmp_path)
    for load in (
        lambda: hf.from_pretrained(transformers.LlamaForCausalLM, str(tmp_path), "performer"),
        lambda: transformers.AutoModelForCausalLM.from_pretrained(
            str(tmp_path), attn_implementation="kattn:performer"
        ),
    ):
        torch.manual_seed(0)
        model = load()
        ids = inputs("llama")["input_ids"]
        with torch.no_grad():
            out = model(ids).logits
        assert torch.isfinite(out).all()
        projection = hf.attention_modules(model)[0].kattn.feature_map.projection
        assert torch.isfinite(projection).all()
        # PRF rows have the norms of a chi distribution with head_dim = 8 degrees (mean 2.7)
        assert 2.0 < projection.norm(dim=-1).mean() < 3.5


def test_options_must_be_recordable() -> None:
    from kattn import positional

    rpe = positional.build("decay", num_heads=4)
    with pytest.raises(ValueError, match=r"option .rpe.*JSON"):
        hf.use(make("llama"), "nprf_rpe", rpe=rpe)


def test_dropout_is_the_models() -> None:
    model = make("gpt2").train()
    with pytest.raises(TypeError, match="dropout"):
        hf.use(model, "softmax", dropout=0.5)
    hf.use(model, "softmax")
    model(**inputs("gpt2"))
    assert {m.kattn.dropout for m in hf.attention_modules(model)} == {0.1}
    model.eval()(**inputs("gpt2"))
    assert {m.kattn.dropout for m in hf.attention_modules(model)} == {0.0}


@pytest.mark.parametrize("name", ["head_dim", "num_heads", "max_len"])
def test_the_layer_sizes_are_not_options(name: str) -> None:
    model = make("llama")
    with pytest.raises(TypeError, match=f"{name}: kattn.hf sizes each kattn module"):
        hf.use(model, "performer", **{name: 8})
    assert model.config._attn_implementation != "kattn:performer"


def test_a_refusal_at_a_later_layer_leaves_the_model_as_it_was(monkeypatch) -> None:
    """use builds every layer's kattn module before attaching the first."""
    from kattn.hf import loading

    build_for, built = loading.build_for, []

    def second_refuses(module, mechanism, options, **kwargs):
        if built:
            raise ValueError("refused for the second layer")
        built.append(module)
        return build_for(module, mechanism, options, **kwargs)

    monkeypatch.setattr(loading, "build_for", second_refuses)
    model = make("llama")
    with pytest.raises(ValueError, match="second layer"):
        hf.use(model, "performer")
    assert built
    assert all(getattr(m, "kattn", None) is None for m in hf.attention_modules(model))
    assert not hasattr(model.config, "kattn")
    assert model.config._attn_implementation != "kattn:performer"


def test_check_use_refuses_what_use_refuses_and_draws_nothing() -> None:
    model = make("llama")
    state = torch.get_rng_state()
    hf.check_use(model, "performer", num_features=8)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(TypeError, match="no_such_option"):
        hf.check_use(model, "performer", no_such_option=1)
    assert all(getattr(m, "kattn", None) is None for m in hf.attention_modules(model))


def test_switching_mechanism_needs_use() -> None:
    model = hf.use(make("llama"), "performer")
    model.set_attn_implementation("kattn:linear")
    with pytest.raises(ValueError, match=r"kattn\.hf\.use"):
        model(**inputs("llama"))
    hf.use(model, "linear")
    assert torch.isfinite(model(**inputs("llama")).logits).all()
