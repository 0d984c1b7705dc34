"""A trained translation run's attentions converted to kernelized attention without
fine-tuning (Luo et al. 2021, §4.5): what is kept, the loss after the conversion, the
converted run folder, ``kattn convert`` and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kattn.attention.kernelized import KernelizedAttention
from kattn.cli import main
from kattn.train import load_trained_model
from kattn.train.bleu import Decoding, translate_texts
from kattn.train.config import RunConfig
from kattn.train.conversion import (
    conversion_target,
    convert_run,
    converted_config,
    evaluate_translation,
    load_run_data,
)
from kattn.train.loop import evaluate_run, train
from kattn.train.validation import validate

from .test_train_translation import tiny_mt, write_iwslt


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A softmax run trained until attention matters (300 steps: its valid loss ≈ 1.1 nats,
    from 5.7), and a normalised-softmax run with a relative encoding (100 steps)."""
    root = tmp_path_factory.mktemp("conversion")
    data = write_iwslt(root / "iwslt")
    settings = {
        "softmax": ("train.steps=300", "train.eval_every=100", "train.length_penalty=0.6",
                    "train.max_len_b=7"),  # decoding settings that are not Decoding's defaults
        "normalized_rpe": ("train.steps=100", "train.eval_every=100",
                           "attention.name=normalized_softmax", 'attention.options.rpe="toeplitz"'),
    }  # fmt: skip
    for name, overrides in settings.items():
        train(validate(tiny_mt(data, *overrides)), root / name, progress=False)
    return {name: root / name for name in settings}


def valid_loss(model: torch.nn.Module, run: Path) -> float:
    config, data = load_run_data(run)
    return float(evaluate_translation(model, config, data, bleu_examples=0)["loss"])


@pytest.mark.parametrize(
    "mechanism, options, expected",
    [
        ("softmax", {}, ("performer", {"num_features": 8})),
        ("softmax_rpe", {}, ("prf_rpe", {"rpe": "toeplitz", "num_features": 8})),
        ("softmax_rpe", {"rpe": None}, ("performer", {"rpe": None, "num_features": 8})),
        ("normalized_softmax", {},
         ("kernelized", {"rpe": None, "normalize_qk": True, "learn_temperature": True,
                         "feature_map": "prf", "num_features": 8})),
        ("normalized_softmax", {"rpe": "bucketed", "num_buckets": 8},
         ("nprf_rpe", {"rpe": "bucketed", "num_buckets": 8, "normalize_qk": True,
                       "learn_temperature": True, "num_features": 8})),
    ],
    ids=["softmax", "softmax_rpe", "softmax_rpe-cross", "normalized", "normalized-rpe"],
)  # fmt: skip
def test_each_softmax_has_its_kernelized_counterpart(mechanism, options, expected) -> None:
    assert conversion_target(mechanism, options, 8) == expected


def test_mechanisms_without_a_counterpart_are_refused() -> None:
    with pytest.raises(ValueError, match="'performer' has no kernelized counterpart"):
        conversion_target("performer", {}, 8)


def test_projections_encoding_and_temperature_are_kept(runs: dict[str, Path]) -> None:
    run = runs["normalized_rpe"]
    trained, _, _ = load_trained_model(run)
    model, conversion = convert_run(run, None, {"num_features": 32})
    before, after = trained.state_dict(), model.state_dict()
    # every entry of the trained model is in the converted one, unchanged
    assert set(before) < set(after)
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)
    bias = before["encoder.layers.0.attn.attention.rpe.bias"]
    assert bias.abs().max() > 1e-3  # trained: a lost or re-initialised table would differ
    assert "encoder.layers.0.attn.attention.log_temperature" in before
    new = [k for k in after if k not in before]
    assert all(".feature_map." in k for k in new) and len(new) >= 3
    assert conversion.converted["encoder"][0] == conversion.converted["decoder"][0] == "nprf_rpe"
    assert conversion.converted["cross"][0] == "kernelized"
    attn = model.encoder.layers[0].attn.attention
    assert isinstance(attn, KernelizedAttention) and attn.feature_map.num_features == 32
    assert conversion.modules["layers.0.cross_attn"].kept == ("log_temperature",)


def test_many_features_keep_the_loss_and_a_wrong_conversion_does_not(runs) -> None:
    """PRF with 2048 features estimates the trained softmax closely; the same features with
    the logits' scale changed (which strict conversion refuses) lose most of what was learnt."""
    run = runs["softmax"]
    trained, _, _ = load_trained_model(run)
    exact = valid_loss(trained, run)
    model, _ = convert_run(run, None, {"num_features": 2048})
    wrong, _ = convert_run(run, "performer", {"num_features": 2048, "scale": 1.0}, strict=False)
    assert exact < 1.5  # attention matters: the loss fell from ≈ 5.7
    assert abs(valid_loss(model, run) - exact) < 0.2
    assert valid_loss(wrong, run) > exact + 1.0


def test_conversions_are_seeded(runs) -> None:
    run = runs["softmax"]
    key = "encoder.layers.0.attn.attention.feature_map.projection"
    draws = [convert_run(run, None, {"num_features": 16}, seed=s)[0].state_dict()[key]
             for s in (3, 3, 4)]  # fmt: skip
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)
    assert not torch.equal(draws[0], draws[2])


def test_the_evaluation_is_that_of_kattn_eval(runs) -> None:
    run = runs["softmax"]
    model, _, _ = load_trained_model(run)
    again = evaluate_run(run, "valid", device="cpu")
    assert valid_loss(model, run) == pytest.approx(again["loss"], rel=1e-6)


def test_convert_out_is_a_run_folder_that_translates(runs, tmp_path: Path, capsys) -> None:
    run, out = runs["softmax"], tmp_path / "converted"
    argv = ["convert", "--run", str(run), "--to", "auto", "--attention-option", "num_features=64",
            "--bleu-examples", "5", "--seed", "7", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "softmax -> performer" in printed and "converted" in printed and "change" in printed
    config = json.loads((out / "config.json").read_text())["attention"]
    assert config["name"] == config["decoder"] == config["cross"] == "performer"
    assert config["options"] == {"num_features": 64}
    report = json.loads((out / "conversion.json").read_text())
    assert report["metrics"]["before"]["bleu_sentences"] == 5
    run_config = json.loads((run / "config.json").read_text())["train"]
    decoding = report["metrics"]["before"]["decoding"]  # the run's, with the command's beam
    assert decoding["beam_size"] == 1
    assert decoding["length_penalty"] == run_config["length_penalty"] == 0.6
    assert (decoding["max_len_a"], decoding["max_len_b"]) == (run_config["max_len_a"],
                                                            run_config["max_len_b"])  # fmt: skip
    source = tmp_path / "in.de"
    source.write_text("wort1 wort2 wort3\nwort4\n", "utf-8")
    target = tmp_path / "out.en"
    assert main(["translate", "--run", str(out), "--input", str(source), "--output",
                 str(target), "--beam", "1"]) == 0  # fmt: skip
    model, _ = convert_run(run, None, {"num_features": 64}, seed=7)
    _, _, bpe = load_trained_model(run)
    decoding = Decoding(1, 0.6, run_config["max_len_a"], 7)  # kattn translate: the run's own
    expected = translate_texts(model, bpe, ["wort1 wort2 wort3", "wort4"], decoding)
    assert target.read_text("utf-8").splitlines() == expected
    assert main(argv) == 2  # the folder holds a run now
    assert "already holds a run" in capsys.readouterr().err


def test_json_output_has_the_metrics_before_and_after(runs, capsys) -> None:
    argv = ["convert", "--run", str(runs["normalized_rpe"]), "--to", "auto", "--only",
            "encoder.*", "--bleu-examples", "0", "--json"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in result["conversion"]["modules"]] == ["encoder.layers.0.attn"]
    assert result["conversion"]["converted"]["decoder"]["mechanism"] == "normalized_softmax"
    assert result["before"]["tokens"] == result["after"]["tokens"] > 0
    assert "bleu" not in result["after"]


def test_strict_refusals_are_command_errors(runs, capsys) -> None:
    run = str(runs["softmax"])
    assert main(["convert", "--run", run, "--to", "nprf_rpe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kattn: error:") and "normalise" in err and "--no-strict" in err
    assert main(["convert", "--run", run, "--to", "auto", "--only", "nothing*"]) == 2
    assert "selects none" in capsys.readouterr().err


def test_other_tasks_are_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(RunConfig().to_json())
    with pytest.raises(NotImplementedError, match="translation runs"):
        convert_run(tmp_path, None)
    assert main(["convert", "--run", str(tmp_path), "--to", "auto"]) == 2
    assert "is a listops run" in capsys.readouterr().err


def test_a_kind_converted_in_part_has_no_run_config(runs) -> None:
    _, conversion = convert_run(runs["softmax"], None, {"num_features": 8})
    config, _ = load_run_data(runs["softmax"])
    assert converted_config(config, conversion).attention.cross == "performer"
    del conversion.converted["decoder"]  # as convert_run leaves a kind converted in part
    with pytest.raises(ValueError, match="decoder attention was converted in some layers"):
        converted_config(config, conversion)
