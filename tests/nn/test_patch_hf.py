"""kattn.patch hands Hugging Face models to kattn.hf (transformers' attention interface)."""

import pytest
import torch
from torch import nn

import kattn

transformers = pytest.importorskip("transformers")
pytest.importorskip("kattn.hf")


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     initializer_range=0.3)  # fmt: skip
    return transformers.BertModel(config).double().eval()


def inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, -3:] = 0
    return ids, mask


def kattn_modules(model):
    return [m for m in model.modules() if isinstance(m, kattn.Attention)]


def test_softmax_through_kattn_hf_keeps_the_outputs():
    model = tiny_bert()
    ids, mask = inputs()
    with torch.no_grad():
        before = model(ids, attention_mask=mask).last_hidden_state
        assert kattn.patch(model, mechanism="softmax") is model
        after = model(ids, attention_mask=mask).last_hidden_state
    assert model.config._attn_implementation == "kattn:softmax"
    assert len(kattn_modules(model)) == 2
    keep = mask.bool()
    torch.testing.assert_close(after[keep], before[keep], rtol=0, atol=1e-6)


def test_a_kernelized_mechanism_really_runs_and_calls_are_counted():
    model = tiny_bert()
    ids, mask = inputs()
    with torch.no_grad():
        before = model(ids, attention_mask=mask).last_hidden_state
        kattn.patch(model, mechanism="performer", num_features=16)
        calls = []
        for module in kattn_modules(model):
            module.register_forward_hook(lambda *_: calls.append(1))
        after = model(ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 2
    assert all(m.feature_map.num_features == 16 for m in kattn_modules(model))
    assert (after - before).abs().max() > 1e-3


def test_a_model_holding_hf_and_x_transformers_parts_gets_both_patched():
    xt = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    model = nn.ModuleDict({
        "text": tiny_bert(),
        "mixer": xt.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8),
    })  # fmt: skip
    kattn.patch(model, mechanism="linear")
    assert model["text"].config._attn_implementation == "kattn:linear"
    assert isinstance(model["mixer"].layers[0][1].attend.attention, kattn.Attention)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"rpe": "module"}, ValueError, "JSON values"),
        ({"dropout": 0.1}, TypeError, "attention dropout of the model's config"),
        ({"max_len": 128}, TypeError, "sizes each kattn module from its attention layer"),
        ({"num_heads": 2}, TypeError, "sizes each mechanism by the attention it replaces"),
    ],
    ids=["option-not-json", "dropout-option", "max-len-option", "num-heads-option"],
)
def test_a_refusal_for_the_hf_part_comes_before_any_change(options, error, message):
    """An option kattn.hf cannot record (a module), a dropout or size option: the torch and
    x-transformers parts, patched first otherwise, stay as they were, and the error says
    why in a sentence."""
    xt = pytest.importorskip("x_transformers")
    from kattn import positional

    torch.manual_seed(0)
    model = nn.ModuleDict({
        "mha": nn.MultiheadAttention(16, 2, batch_first=True),
        "text": tiny_bert(),
        "mixer": xt.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8),
    })  # fmt: skip
    if options.get("rpe") == "module":
        options = {"rpe": positional.build("decay", num_heads=2)}
        mechanism = "nprf_rpe"
    else:
        mechanism = "softmax"
    with pytest.raises(error, match=message):
        kattn.patch(model, mechanism=mechanism, **options)
    assert type(model["mha"]) is nn.MultiheadAttention
    assert type(model["mixer"].layers[0][1].attend).__name__ == "Attend"
    assert model["text"].config._attn_implementation != f"kattn:{mechanism}"
    assert not kattn_modules(model)


def test_a_build_the_hf_part_refuses_comes_before_any_change(monkeypatch):
    """kattn.hf builds a kattn module for the Hugging Face part before the torch part is
    swapped: a mechanism refusing the BERT layers (here by a stand-in) changes nothing."""
    from kattn.hf import loading

    def refuse(module, mechanism, options, **kwargs):
        raise ValueError("refused for this layer")

    monkeypatch.setattr(loading, "build_for", refuse)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    model = nn.ModuleDict({"mha": mha, "text": tiny_bert()})
    with pytest.raises(ValueError, match="refused for this layer"):
        kattn.patch(model, mechanism="performer")
    assert type(model["mha"]) is nn.MultiheadAttention
    assert model["text"].config._attn_implementation != "kattn:performer"
    assert not kattn_modules(model)


def test_the_check_before_patching_draws_no_random_numbers():
    """The Hugging Face part gets the random features kattn.hf.use would give it."""
    import kattn.hf

    torch.manual_seed(0)
    patched = kattn.patch(tiny_bert(), mechanism="performer", num_features=8)
    torch.manual_seed(0)
    used = kattn.hf.use(tiny_bert(), "performer", num_features=8)
    for a, b in zip(kattn_modules(patched), kattn_modules(used), strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
