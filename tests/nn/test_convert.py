"""``convert_attention``: a model trained with normalised softmax attention and a relative bias
converts to ``nprf_rpe`` keeping its bias and temperatures (Luo et al. 2021, §4.5); the report
says what moved; conversions that would change the function are refused."""

import pytest
import torch

import kattn
from kattn.nn import ConversionReport, MultiheadAttention, TransformerEncoder, convert_attention

VOCAB, MAX_LEN, HEADS = 50, 64, 4
TAU = (0.8, 1.0, 1.25, 1.5)


def trained_like(mechanism="normalized_softmax", *, seed=0, **options):
    """A small float64 encoder whose relative bias (shared by the layers) and temperatures
    are far from their initial 0 and 1, as after training."""
    torch.manual_seed(seed)
    model = (
        TransformerEncoder(
            VOCAB, MAX_LEN, dim=32, depth=2, num_heads=HEADS, mechanism=mechanism, **options
        )
        .double()
        .eval()
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        rpe = getattr(model.layers[0].attn.attention, "rpe", None)
        if rpe is not None:
            rpe.bias.copy_(2.0 * torch.randn(rpe.bias.shape, generator=g, dtype=torch.float64))
        for layer in model.layers:
            log_t = getattr(layer.attn.attention, "log_temperature", None)
            if log_t is not None:
                log_t.copy_(torch.tensor(TAU).log())
    return model


TOKENS = torch.randint(0, VOCAB, (3, 48), generator=torch.Generator().manual_seed(2))


def relative_error(model, reference):
    with torch.no_grad():
        out = model(TOKENS)
    return float((out - reference).norm() / reference.norm())


def test_normalised_attention_with_rpe_converts_to_nprf_rpe_closely():
    model = trained_like(rpe="toeplitz")
    with torch.no_grad():
        reference = model(TOKENS)
    torch.manual_seed(5)
    convert_attention(model, "nprf_rpe", num_features=4096, learn_temperature=True)
    assert all(layer.attn.mechanism == "nprf_rpe" for layer in model.layers)
    converted = relative_error(model, reference)
    # the same conversion without the relative bias: what a conversion that lost it gives
    without_bias = trained_like(rpe="toeplitz")
    torch.manual_seed(5)
    convert_attention(without_bias, "nprf_rpe", num_features=4096, learn_temperature=True)
    with torch.no_grad():
        without_bias.layers[0].attn.attention.rpe.bias.zero_()
    lost = relative_error(without_bias, reference)
    assert converted < 0.06 and lost > 0.5, (converted, lost)


def test_the_report_lists_what_was_kept_initialised_and_dropped():
    model = trained_like(rpe="toeplitz")
    report = convert_attention(model, "nprf_rpe", num_features=64, learn_temperature=True)
    assert isinstance(report, ConversionReport) and len(report) == 2
    assert [m.name for m in report] == ["layers.0.attn", "layers.1.attn"]
    first = report["layers.0.attn"]
    assert (first.source, first.target) == ("normalized_softmax", "nprf_rpe")
    assert set(first.kept) == {"rpe.bias", "log_temperature"}
    assert "feature_map.projection" in first.initialised and first.dropped == ()
    assert "layers.1.attn: normalized_softmax -> nprf_rpe; kept: " in str(report)
    attn = model.layers[1].attn.attention
    torch.testing.assert_close(attn.log_temperature.detach().exp(), torch.tensor(TAU).double())
    assert isinstance(attn.log_temperature, torch.nn.Parameter)
    # the encoding the layers shared stays one module, holding the trained values
    assert model.layers[0].attn.attention.rpe is attn.rpe
    assert attn.rpe.bias.std() > 1.0
    with pytest.raises(KeyError, match=r"layers\.2\.attn"):
        report["layers.2.attn"]


def test_converting_there_and_back_gives_the_same_function():
    model = trained_like(rpe="toeplitz")
    with torch.no_grad():
        reference = model(TOKENS)
    convert_attention(model, "nprf_rpe", num_features=16, learn_temperature=True)
    report = convert_attention(model, "normalized_softmax", rpe="toeplitz")
    assert set(report["layers.0.attn"].dropped) == {
        "feature_map.projection",
        "feature_map._extra_state",
    }
    assert relative_error(model, reference) < 1e-12


def test_projections_device_dtype_and_training_mode_stay():
    model = trained_like(rpe="toeplitz").train()
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if "in_proj" in n}
    convert_attention(model, "nprf_rpe", learn_temperature=True)
    for name, p in model.named_parameters():
        if name in weights:
            assert torch.equal(p, weights[name]), name
    attn = model.layers[0].attn.attention
    assert attn.training and attn.rpe.bias.dtype == torch.float64


def test_only_converts_the_matching_modules():
    model = trained_like(rpe="toeplitz")
    report = convert_attention(model, "nprf_rpe", only="layers.1.*", learn_temperature=True)
    assert [m.name for m in report] == ["layers.1.attn"]
    assert [layer.attn.mechanism for layer in model.layers] == ["normalized_softmax", "nprf_rpe"]
    model = trained_like(rpe="toeplitz")
    report = convert_attention(
        model,
        "nprf_rpe",
        learn_temperature=True,
        only=lambda name, module: name.startswith("layers.0"),
    )
    assert [m.name for m in report] == ["layers.0.attn"]


def test_a_multihead_attention_converts_itself():
    mha = MultiheadAttention(16, 2, mechanism="softmax")
    report = convert_attention(mha, "performer")
    assert mha.mechanism == "performer" and report[""].source == "softmax"
    assert "(model): softmax -> performer" in str(report)


@pytest.mark.parametrize(
    ("source", "source_options", "target", "target_options", "message"),
    [
        ("normalized_softmax", {}, "performer", {}, "normalises q and k"),
        ("softmax", {}, "nprf_rpe", {}, "does not normalise"),
        ("softmax_rpe", {}, "performer", {}, "relative positional encoding"),
        ("normalized_softmax", {"rpe": "toeplitz"}, "nprf_rpe", {}, "log_temperature"),
        ("softmax_rpe", {}, "prf_rpe", {"rpe": "bucketed"}, "rpe.bias"),
        ("softmax_rpe", {"scale": 0.5}, "prf_rpe", {}, "scales per head differ"),
        (
            "normalized_softmax",
            {"learn_temperature": False, "temperature": 2.0},
            "nprf_rpe",
            {},
            "log_temperature",
        ),
    ],
    ids=[
        "normalisation",
        "normalisation-added",
        "rpe",
        "temperature",
        "encoding",
        "scale",
        "fixed-temperature",
    ],
)
def test_obvious_changes_of_the_function_are_refused(
    source, source_options, target, target_options, message
):
    model = trained_like(source, **source_options)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        convert_attention(model, target, **target_options)
    assert all(layer.attn.mechanism == source for layer in model.layers)  # nothing changed
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    report = convert_attention(model, target, strict=False, **target_options)
    assert all(layer.attn.mechanism == target for layer in model.layers)
    assert len(report) == 2


def test_conversions_that_keep_the_function_shape_pass():
    model = trained_like("softmax")
    report = convert_attention(model, "performer")  # exp(q·k/√D) on both sides
    assert report["layers.0.attn"].kept == ()
    model = trained_like("softmax_rpe", rpe="bucketed")
    report = convert_attention(model, "prf_rpe", rpe="bucketed")
    assert report["layers.0.attn"].kept == ("rpe.bias",)


def test_no_module_to_convert_and_unknown_names_are_value_errors():
    with pytest.raises(ValueError, match=r"no kattn\.MultiheadAttention"):
        convert_attention(torch.nn.Linear(3, 3), "performer")
    with pytest.raises(ValueError, match="matching only="):
        convert_attention(trained_like(), "performer", only="decoder.*")
    with pytest.raises(ValueError, match="unknown mechanism 'no_such'"):
        convert_attention(trained_like(), "no_such")
    with pytest.raises(TypeError, match="no_such_option"):
        convert_attention(trained_like(), "softmax", no_such_option=1)
    assert kattn.convert_attention is convert_attention
