"""Tasks text-classification and finetune through the one training loop on files written
here: a tiny mlm run's encoder starts the fine-tuned model (its weights, its fields adopted,
other fields refused), AG News's layout and GLUE's (regression for STS-B, MNLI's mismatched
dev set) end with the official metrics beside the baseline's, the command line's --from and
--glue, and the run read back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kattn.cli import main
from kattn.data.agnews import write_agnews_csv
from kattn.train import apply_overrides, load_trained_model, preset
from kattn.train.checkpoint import BEST, load_checkpoint
from kattn.train.config import RunConfig
from kattn.train.finetune import (
    TextClassification,
    adopt_start,
    check_start,
    start_encoder_state,
)
from kattn.train.loop import train
from kattn.train.objective_base import ClassAccuracy
from kattn.train.objectives import build_objective, objective_class
from kattn.train.validation import validate

from ..data.test_glue import write_release
from ..data.test_lm_data import write_text

SHAPE = ["model.dim=16", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=32"]
LOOP = ["train.steps=4", "train.batch_size=8", "train.eval_every=2", "train.log_every=2",
        "optim.warmup_steps=1", "optim.lr=3e-3"]  # fmt: skip


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny mlm run (sequences of 24 bytes, softmax) on a corpus written here."""
    root = tmp_path_factory.mktemp("mlm")
    write_text(root / "corpus.txt", lines=300)
    config = preset("small", "mlm")
    config.data.path, config.train.device = str(root / "corpus.txt"), "cpu"
    apply_overrides(config, [*SHAPE, *LOOP, "data.max_len=24", "train.eval_batches=2"])
    train(config, root / "run", progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def agnews(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-class set in AG News's layout whose class a word of the text gives away."""
    folder = tmp_path_factory.mktemp("agnews")
    words = ("apple", "river", "stone")
    for name, n in (("train.csv", 60), ("test.csv", 15)):
        texts = [f"the {words[i % 3]} of line {i}" for i in range(n)]
        write_agnews_csv(folder / name, texts, [i % 3 for i in range(n)])
    return folder


def finetune_config(run: Path, data: Path, *overrides: str) -> RunConfig:
    config = preset("small", "finetune")
    config.data.path, config.model.init_from, config.train.device = str(data), str(run), "cpu"
    apply_overrides(config, [*LOOP, *overrides])
    return adopt_start(config, set())


def test_finetuning_starts_from_the_mlm_encoder(mlm_run: Path, agnews: Path, tmp_path: Path):
    config = finetune_config(mlm_run, agnews)
    assert (config.model.dim, config.data.max_len) == (16, 24)  # adopted from the run
    pretrained = start_encoder_state(mlm_run / BEST)
    # the model the task builds holds the pre-trained encoder exactly, before any step
    objective = build_objective(config, objective_class("finetune").load_data(config))
    built = objective.build_model(config).encoder.state_dict()
    assert built.keys() == pretrained.keys()
    assert all(torch.equal(built[k], pretrained[k]) for k in pretrained)
    results = train(config, tmp_path / "ft", progress=False)
    assert results["task"] == "finetune" and results["init_from"] == str(mlm_run / BEST)
    assert results["metric_names"] == ["accuracy"]
    assert set(results["test_metrics"]) == {"accuracy"}
    assert results["baseline_test_metrics"]["accuracy"] == pytest.approx(5 / 15)
    assert results["majority_baseline"] == pytest.approx(5 / 15)
    assert results["data"]["sizes"] == {"train": 54, "valid": 6, "test": 15}
    # the run started from the pre-trained encoder: its token embedding moved from there, not
    # from a fresh draw
    tuned = load_checkpoint(tmp_path / "ft" / BEST)["model"]
    step = (tuned["encoder.embedding.weight"] - pretrained["embedding.weight"]).abs().max()
    assert 0 < float(step) < 0.1
    model, saved, _ = load_trained_model(tmp_path / "ft")
    assert saved.model.init_from == str(mlm_run) and model.head.out.out_features == 3


def test_encoder_fields_must_be_the_runs(mlm_run: Path, agnews: Path) -> None:
    config = finetune_config(mlm_run, agnews)
    config.model.num_heads = 4
    config.attention.options = {"rpe": "toeplitz"}
    with pytest.raises(
        ValueError,
        match=r"model.num_heads is 4 here and 2 in the run; "
        r"attention.options is \{'rpe': 'toeplitz'\} here and \{\} in the run",
    ):
        check_start(config)  # fmt: skip
    given = finetune_config(mlm_run, agnews)
    given.model.dim = 32
    with pytest.raises(ValueError, match=r"model\.dim is 32 here and 16 in the run"):
        adopt_start(given, {"model.dim"})  # a field the user set is kept, and refused
    with pytest.raises(ValueError, match="needs a pre-trained run: give --from RUN"):
        validate(apply_overrides(preset("small", "finetune"), ["model.init_from=null"]))
    scratch = preset("small", "text-classification")
    scratch.model.init_from = str(mlm_run)
    with pytest.raises(ValueError, match=r"model\.init_from is for task finetune"):
        validate(scratch)


def test_stsb_regression_from_scratch(tmp_path: Path) -> None:
    root = write_release(tmp_path / "glue", ("STS-B",))
    rows = (tmp_path / "glue" / "STS-B" / "train.tsv").read_text().splitlines()
    extra = [
        f"{i}\tg\tf\ty\t0\tn\tn\tA plane {i}.\tA dog {i}.\t{i % 6 * 0.9:.1f}" for i in range(30)
    ]
    (root / "STS-B" / "train.tsv").write_text("\n".join(rows + extra) + "\n")
    dev = (root / "STS-B" / "dev.tsv").read_text() + "7\tg\tf\ty\t0\tn\tn\tX.\tY z.\t3.1\n"
    (root / "STS-B" / "dev.tsv").write_text(dev)
    config = preset("small", "text-classification")
    config.data.path, config.data.glue, config.train.device = str(root), "STS-B", "cpu"
    apply_overrides(config, [*SHAPE, *LOOP, "data.max_len=40"])
    results = train(config, tmp_path / "run", progress=False)
    assert results["metric_names"] == ["pearson", "spearman"]
    assert set(results["test_metrics"]) == {"pearson", "spearman"}
    assert results["test_accuracy"] is None and results["best_valid_loss"] > 0
    assert math.isnan(results["baseline_test_metrics"]["pearson"])  # a constant: undefined
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["baseline_test_metrics"]["pearson"] is None
    assert results["majority_baseline"] is None


@pytest.mark.parametrize("regression", [False, True], ids=["classes", "regression"])
def test_text_tasks_count_and_score_as_the_class_accuracy(regression: bool) -> None:
    """The text tasks use the classifiers' ClassAccuracy counts and metrics; regression
    counts nothing correct and reports no accuracy."""
    objective = object.__new__(TextClassification)  # counts and metrics read only the data
    objective.data = SimpleNamespace(regression=regression)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    batch = {"labels": torch.tensor([0, 0, 0])}
    assert isinstance(objective, ClassAccuracy)
    assert objective.counts(logits, batch) == ((0, 3) if regression else (2, 3))
    metrics = objective.metrics([1.5, 2.0, 3.0], "valid")
    assert metrics.pop("accuracy", None) == (None if regression else 2 / 3)
    assert metrics == {"loss": 0.5, "examples": 3}


def test_mnli_reports_both_dev_sets_from_the_command_line(
    mlm_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_release(tmp_path / "glue", ("MNLI",))
    train_tsv = root / "MNLI" / "train.tsv"
    line = train_tsv.read_text().splitlines()[1]
    labels = ("neutral", "entailment", "contradiction")
    more = [line.rsplit("\t", 2)[0] + f"\t{labels[i % 3]}\t{labels[i % 3]}" for i in range(20)]
    train_tsv.write_text(train_tsv.read_text() + "\n".join(more) + "\n")
    args = ["train", "--task", "finetune", "--from", str(mlm_run), "--data", str(root),
            "--glue", "mnli", "--out", str(tmp_path / "run"), "--device", "cpu",
            "--no-progress", *(f"--set={item}" for item in LOOP)]  # fmt: skip
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["task"] == "finetune" and set(printed["test_metrics"]) == {"accuracy"}
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["data"]["sizes"]["test_mismatched"] == 1
    assert "test_mismatched_metrics" in results and "baseline_valid_metrics" in results
    assert results["config"]["data"]["glue"] == "mnli"
    assert results["config"]["model"]["dim"] == 16  # the run's, through --from


def test_the_command_line_refuses_text_flags_for_other_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "--task", "mlm", "--from", "runs/x", "--print-config"]) != 0
    assert "--from is for task finetune, not mlm" in capsys.readouterr().err
    assert main(["train", "--task", "listops", "--glue", "rte", "--print-config"]) != 0
    assert "--glue is for tasks text-classification and finetune" in capsys.readouterr().err


def test_presets_of_the_papers_resolve() -> None:
    for name, lr in (("luo-bert-base", 2e-5), ("kl-glue", 1e-4)):
        config = preset(name, "finetune")
        assert config.optim.lr == lr and config.optim.schedule == "linear"
    assert preset("kl-glue", "finetune").model.head_hidden == 128
    assert preset("small", "text-classification").model.pooling == "cls"
