"""``kattn train --task lm``: a tiny causal language model through the one training loop —
results and metrics, best checkpoint by lowest validation loss, exact resume, evaluation
again, the run folder read back, a subword tokenizer, presets, refusals."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from kattn.cli import main
from kattn.data import ByteTokenizer, HFTokenizer
from kattn.nn import CausalLM
from kattn.train import load_trained_model
from kattn.train.checkpoint import BEST, RunState
from kattn.train.config import RunConfig
from kattn.train.loop import Interrupted, evaluate_run, train
from kattn.train.metrics import iter_records
from kattn.train.tasks import build_lm

from ..data.test_lm_data import bpe_file, write_text  # noqa: F401  (the fixture)
from .test_train_distributed import train_in_one_and_two_processes
from .test_train_loop import (  # noqa: F401  (the fixture)
    assert_same_final_weights,
    listops_dir,
    tiny,
)

REQUIRED = (
    "task", "mechanism", "steps", "test_loss", "test_perplexity", "test_bits_per_byte",
    "best_valid_loss", "best_valid_perplexity", "best_valid_bits_per_byte",
    "unigram_bits_per_byte", "wall_time_s", "steps_per_s", "tokens_per_s", "peak_memory_bytes",
    "num_parameters", "config", "corpus", "tokenizer",
)  # fmt: skip
BLOCK = 32


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_text(path, lines=600)
    return path


def tiny_lm(path: Path, *overrides: str) -> RunConfig:
    """The tiny run of the training-loop tests on the text of ``path``, blocks of ``BLOCK``."""
    return tiny(
        "lm", path, f"data.block_size={BLOCK}", "train.log_every=4", "train.eval_batches=2",
        "optim.lr=3e-3", *overrides,
    )  # fmt: skip


def records(run: Path) -> list[dict]:
    timed = ("steps_per_s", "tokens_per_s")
    return [{k: v for k, v in r.items() if k not in timed} for r in iter_records(run)]


@pytest.mark.parametrize("mechanism", ["softmax", "performer"])
def test_a_tiny_lm_run_reports_perplexity_and_bits_per_byte(corpus_file, tmp_path, mechanism):
    config = tiny_lm(corpus_file, f"attention.name={json.dumps(mechanism)}")
    results = train(config, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    saved = json.loads((run / "results.json").read_text())
    assert set(REQUIRED) <= set(saved) and saved["task"] == "lm" and saved["steps"] == 12
    assert saved["test_loss"] == pytest.approx(results["test_loss"])
    assert results["test_perplexity"] == pytest.approx(math.exp(results["test_loss"]))
    # bytes: one token per byte, so bits per byte = nats per token / ln 2
    assert results["test_bits_per_byte"] == pytest.approx(results["test_loss"] / math.log(2))
    test_bytes = saved["corpus"]["bytes"]["test"]  # every full block of the split, in order
    assert results["test_tokens"] == (test_bytes - 1) // BLOCK * BLOCK
    assert results["best_valid_perplexity"] == pytest.approx(math.exp(results["best_valid_loss"]))
    assert 0 < results["unigram_bits_per_byte"] < 8
    assert results["test_bits_per_byte"] < 8  # below a uniform guess over bytes after training
    assert saved["tokenizer"]["kind"] == "bytes" and saved["corpus"]["layout"] == "file"
    assert saved["tokens_per_s"] == pytest.approx(saved["steps_per_s"] * 8 * BLOCK)
    rows = list(iter_records(run))
    valid = [r for r in rows if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [4, 8, 12]
    assert all(r["tokens"] == 2 * 8 * BLOCK for r in valid)  # eval_batches=2 of 8 blocks
    for r in rows:
        assert r["perplexity"] == pytest.approx(math.exp(r["loss"]))
        assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2))
    # the best checkpoint is the lowest validation loss
    lowest = min(valid, key=lambda r: r["loss"])
    assert results["best_step"] == lowest["step"] and results["best_valid_loss"] == lowest["loss"]
    assert [r["best"] for r in valid] == [
        r["loss"] < min([v["loss"] for v in valid[:i]], default=math.inf)
        for i, r in enumerate(valid)
    ]
    assert torch.load(run / BEST, weights_only=False)["step"] == lowest["step"]


def test_interrupt_and_resume_ends_with_the_same_numbers(corpus_file, tmp_path):
    config = tiny_lm(corpus_file, "model.dropout=0.1", 'attention.name="performer"')
    whole = train(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupted):
        train(config, tmp_path / "parts", progress=False, stop_after=5)
    with pytest.raises(Interrupted):
        train(config, tmp_path / "parts", resume=True, progress=False, stop_after=9)
    parts = train(config, tmp_path / "parts", resume=True, progress=False)
    for key in ("test_loss", "test_bits_per_byte", "best_valid_loss", "best_step", "steps"):
        assert parts[key] == whole[key], key
    assert records(tmp_path / "parts") == records(tmp_path / "whole")
    assert_same_final_weights(tmp_path / "whole", tmp_path / "parts")


def test_eval_again_and_the_run_folder_read_back(corpus_file, tmp_path, capsys):
    results = train(tiny_lm(corpus_file, "train.steps=6"), tmp_path / "run", progress=False)
    again = evaluate_run(tmp_path / "run", "test", device="cpu")
    assert again["loss"] == pytest.approx(results["test_loss"], rel=1e-6)
    assert again["bits_per_byte"] == pytest.approx(results["test_bits_per_byte"], rel=1e-6)
    assert again["tokens"] == results["test_tokens"] and again["step"] == results["best_step"]
    assert main(["eval", "--run", str(tmp_path / "run"), "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["perplexity"] == pytest.approx(results["test_perplexity"], rel=1e-6)

    model, config, tokenizer = load_trained_model(tmp_path / "run")
    assert isinstance(model, CausalLM) and isinstance(tokenizer, ByteTokenizer)
    assert not model.training and config.data.block_size == BLOCK
    reference = build_lm(config, 256)
    reference.load_state_dict(torch.load(tmp_path / "run" / BEST, weights_only=False)["model"])
    reference.eval()
    test = tokenizer.encode_array(corpus_file.read_bytes()[-4 * (BLOCK + 1) :]).long()
    blocks = test.view(4, BLOCK + 1)
    with torch.no_grad():
        logits = model(blocks[:, :-1])
        assert torch.equal(logits, reference(blocks[:, :-1]))
    assert logits.shape == (4, BLOCK, 256)


def test_a_classification_run_reads_back_without_tokenizer(listops_dir, tmp_path):  # noqa: F811
    train(tiny("listops", listops_dir, "train.steps=2"), tmp_path / "run", progress=False)
    model, config, tokenizer = load_trained_model(tmp_path / "run", checkpoint="last")
    assert tokenizer is None and config.data.task == "listops" and not model.training
    with pytest.raises(ValueError, match="not a run folder"):
        load_trained_model(tmp_path)


def test_a_tokenizer_file_is_copied_into_the_run(corpus_file, bpe_file, tmp_path):  # noqa: F811
    given = tmp_path / "given.json"
    shutil.copyfile(bpe_file, given)
    config = tiny_lm(corpus_file, "train.steps=4", "train.eval_every=2", "data.block_size=16")
    config.data.tokenizer = str(given)
    results = train(config, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == bpe_file.read_bytes()
    assert results["tokenizer"]["kind"] == "huggingface"
    assert results["tokenizer"]["vocab_size"] == 300
    assert results["test_bits_per_byte"] < results["test_loss"] / math.log(2)  # > 1 byte/token
    given.unlink()  # the run folder is enough without the original file
    model, _, tokenizer = load_trained_model(tmp_path / "run")
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.vocab_size == 300
    assert model.head.weight.shape[0] == 300  # type: ignore[union-attr, index]
    again = evaluate_run(tmp_path / "run", "test", device="cpu")
    assert again["loss"] == pytest.approx(results["test_loss"], rel=1e-6)


def test_a_mechanism_without_causal_form_is_refused(corpus_file, tmp_path, capsys):
    config = tiny_lm(corpus_file, 'attention.name="skyformer"')
    with pytest.raises(ValueError, match="'skyformer' has no causal form"):
        train(config, tmp_path / "run", progress=False)
    argv = ["train", "--task", "lm", "--attention", "linformer", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "causal" in capsys.readouterr().err


def test_checkpoints_of_older_runs_resume():
    """Run states saved before the loop kept whole validation metrics still load."""
    old = {"step": 8, "best_valid_accuracy": 0.5, "best_step": 4, "stale_evals": 1}
    state = RunState.from_dict(old)
    assert state.best_valid == {"accuracy": 0.5} and state.step == 8 and state.best_step == 4
    assert RunState.from_dict({**old, "best_valid_accuracy": None}).best_valid is None


def config_of(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict, str]:
    assert main(["train", *argv, "--print-config"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_presets_flags_and_foreign_preset_options(capsys):
    small, _ = config_of(capsys, "--task", "lm")
    assert small["data"]["block_size"] == 256 and small["model"]["num_layers"] == 2
    assert small["data"]["path"] is None and small["data"]["tokenizer"] is None
    luo, note = config_of(capsys, "--task", "lm", "--data", "wikitext-103", "--block-size", "128")
    assert luo["model"]["num_layers"] == 6 and luo["model"]["dim"] == 512  # luo-lm with --data
    assert luo["attention"]["name"] == "performer"
    assert luo["attention"]["options"] == {"num_features": 64}
    assert luo["data"]["block_size"] == 128 and note == ""
    soft, note = config_of(capsys, "--task", "lm", "--preset", "luo-lm", "--attention", "softmax")
    assert soft["attention"]["options"] == {} and "num_features=64" in note
    kept, note = config_of(
        capsys, "--task", "lm", "--preset", "luo-lm", "--attention", "softmax",
        "--attention-option", "num_features=8", "--tokenizer", "t.json",
    )  # fmt: skip
    assert kept["attention"]["options"] == {"num_features": 8} and note == ""
    assert kept["data"]["tokenizer"] == "t.json"
    same, note = config_of(
        capsys, "--task", "lm", "--preset", "luo-lm", "--set", "attention.name=softmax",
        "--set", "attention.options.num_features=64",
    )  # fmt: skip
    assert same["attention"]["name"] == "softmax"
    assert same["attention"]["options"] == {"num_features": 64}
    assert note == ""  # given by the user: kept (and refused when the model is built)
    config = RunConfig.from_dict(luo)
    model = build_lm(config, 256)
    assert isinstance(model, CausalLM) and model.max_len == 128 and len(model.layers) == 6


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "lm", "--preset", "skyformer"], "no lm configuration"),
        (["--task", "listops", "--block-size", "64"], "data.block_size is for task lm"),
        (["--task", "lm", "--set", "data.max_len=64"], "data.max_len is not used by task lm"),
        (["--task", "lm", "--block-size", "0"], "data.block_size must be positive"),
        (["--task", "lm", "--attention-option", "bogus=1", "--steps", "1"], "bogus"),
    ],
)
def test_bad_lm_flags_exit_2_with_a_message(capsys, tmp_path, argv, message):
    assert main(["train", *argv, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_match_one(corpus_file, tmp_path):
    config = tiny_lm(corpus_file, "train.steps=6", "train.eval_every=3", "train.log_every=1")
    one, two, _ = train_in_one_and_two_processes(config, tmp_path)
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
    assert two["test_tokens"] == one["test_tokens"]
    losses = {
        run: [r["loss"] for r in iter_records(tmp_path / run) if r["split"] != "test"]
        for run in ("one", "two")
    }
    assert losses["two"] == pytest.approx(losses["one"], rel=1e-5)
