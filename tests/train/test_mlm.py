"""``kattn train --task mlm``: a tiny masked language model through the one training loop —
packed sequences, results and the loss curve, the same evaluation masks in every run, exact
resume, the run folder read back, whole-word masking, presets and refusals."""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from kattn.cli import main
from kattn.data import ByteTokenizer
from kattn.data.mlm_vocab import mlm_vocab
from kattn.nn import MaskedLM
from kattn.train import load_trained_model, preset
from kattn.train.config import RunConfig
from kattn.train.loop import Interrupted, evaluate_run, train
from kattn.train.metrics import iter_records
from kattn.train.mlm import build_masked_lm, run_vocab
from kattn.train.mlm_data import CURVE, pack_sequences
from kattn.train.validation import validate

from ..data.test_lm_data import write_text
from .test_train_loop import assert_same_final_weights, tiny

MAX_LEN = 24
REQUIRED = (
    "task", "mechanism", "steps", "test_loss", "test_accuracy", "test_perplexity",
    "test_masked_tokens", "best_valid_loss", "best_valid_accuracy", "unigram_loss",
    "unigram_accuracy", "curve", "curve_file", "masking", "sequences", "vocab", "corpus",
    "tokenizer", "tokens_per_s",
)  # fmt: skip


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_text(path, lines=400)
    return path


def tiny_mlm(path: Path, *overrides: str) -> RunConfig:
    """The tiny run of the training-loop tests on the text of ``path``, sequences of
    ``MAX_LEN``."""
    return tiny(
        "mlm", path, f"data.max_len={MAX_LEN}", "train.log_every=4", "train.eval_batches=2",
        "optim.lr=3e-3", *overrides,
    )  # fmt: skip


def test_packing_wraps_pieces_in_cls_and_sep_and_pads_the_last():
    vocab = mlm_vocab(ByteTokenizer())
    rows = pack_sequences(torch.arange(10), vocab, 6)  # pieces of 4
    assert rows.tolist() == [
        [257, 0, 1, 2, 3, 258],
        [257, 4, 5, 6, 7, 258],
        [257, 8, 9, 258, 256, 256],
    ]
    assert rows.dtype == torch.int16  # 260 ids: two bytes each
    exact = pack_sequences(torch.arange(8, dtype=torch.uint8), vocab, 6)
    assert exact.tolist() == [[257, 0, 1, 2, 3, 258], [257, 4, 5, 6, 7, 258]]
    with pytest.raises(ValueError, match="at least 3"):
        pack_sequences(torch.arange(10), vocab, 2)


@pytest.mark.parametrize("mechanism", ["softmax", "nprf_rpe"])
def test_a_tiny_mlm_run_reports_masked_loss_baseline_and_curve(corpus_file, tmp_path, mechanism):
    config = tiny_mlm(corpus_file, f"attention.name={json.dumps(mechanism)}")
    run = tmp_path / "run"
    results = train(config, run, progress=False)
    saved = json.loads((run / "results.json").read_text())
    assert set(REQUIRED) <= set(saved) and saved["task"] == "mlm" and saved["steps"] == 12
    assert saved["test_loss"] == pytest.approx(results["test_loss"])
    assert results["test_perplexity"] == pytest.approx(math.exp(results["test_loss"]))
    test_bytes = saved["corpus"]["bytes"]["test"]
    assert saved["sequences"]["test"] == math.ceil(test_bytes / (MAX_LEN - 2))
    # about 0.15 of the test bytes are scored, each sequence at least once
    assert 0.10 < results["test_masked_tokens"] / test_bytes < 0.20
    assert results["test_loss"] < math.log(256)  # better than a uniform guess after training
    assert 0 < results["unigram_loss"] < math.log(256) and 0 < results["unigram_accuracy"] < 1
    assert saved["vocab"]["vocab_size"] == 260 and saved["tokenizer"]["kind"] == "bytes"
    assert saved["tokens_per_s"] == pytest.approx(saved["steps_per_s"] * 8 * MAX_LEN)
    rows = list(iter_records(run))
    valid = [r for r in rows if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [4, 8, 12]
    lowest = min(valid, key=lambda r: r["loss"])
    assert results["best_step"] == lowest["step"] and results["best_valid_loss"] == lowest["loss"]
    with (run / CURVE).open() as file:
        curve = list(csv.DictReader(file))
    assert [(int(r["step"]), r["split"]) for r in curve] == [
        (r["step"], r["split"]) for r in rows if r["split"] in ("train", "valid")
    ]
    assert [p[0] for p in saved["curve"]["valid"]] == [4, 8, 12]
    assert saved["curve"]["train"][-1][1] == pytest.approx(float(curve[-2]["loss"]), abs=1e-6)
    assert json.loads((run / "mlm_vocab.json").read_text())["mask_id"] == 259
    if saved["curve_plot"] is not None:  # matplotlib installed
        assert (run / "mlm_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluation_masks_are_the_same_in_every_run(corpus_file, tmp_path):
    a = train(tiny_mlm(corpus_file, "train.steps=2"), tmp_path / "a", progress=False)
    b = train(tiny_mlm(corpus_file, "train.steps=3", "train.seed=7", "model.dim=8"),
              tmp_path / "b", progress=False)  # fmt: skip
    assert a["test_masked_tokens"] == b["test_masked_tokens"]
    assert a["unigram_loss"] == b["unigram_loss"]
    assert a["test_loss"] != b["test_loss"]
    again = evaluate_run(tmp_path / "a", "test", device="cpu")
    assert again["loss"] == pytest.approx(a["test_loss"], rel=1e-6)
    assert again["masked_tokens"] == a["test_masked_tokens"]
    torch.manual_seed(1)  # the training split read again has fixed masks too
    first = evaluate_run(tmp_path / "a", "train", device="cpu")
    torch.manual_seed(2)
    assert evaluate_run(tmp_path / "a", "train", device="cpu") == first


def test_interrupt_and_resume_ends_with_the_same_numbers(corpus_file, tmp_path):
    config = tiny_mlm(corpus_file, "model.dropout=0.1")
    whole = train(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupted):
        train(config, tmp_path / "parts", progress=False, stop_after=5)
    parts = train(config, tmp_path / "parts", resume=True, progress=False)
    for key in ("test_loss", "test_accuracy", "best_valid_loss", "best_step", "curve"):
        assert parts[key] == whole[key], key
    assert_same_final_weights(tmp_path / "whole", tmp_path / "parts")


def test_the_run_folder_reads_back_with_its_special_ids(corpus_file, tmp_path):
    train(tiny_mlm(corpus_file, "train.steps=2"), tmp_path / "run", progress=False)
    model, config, tokenizer = load_trained_model(tmp_path / "run")
    assert isinstance(model, MaskedLM) and isinstance(tokenizer, ByteTokenizer)
    assert not model.training and config.data.task == "mlm" and model.max_len == MAX_LEN
    vocab = run_vocab(tmp_path / "run")
    assert vocab.mask_id == 259 and model.vocab_size == vocab.vocab_size
    tokens = torch.tensor([[vocab.cls_id, *tokenizer.encode("def f(x):"), vocab.sep_id]])
    assert model(tokens).shape == (1, tokens.shape[1], 260)


def test_whole_word_masking_runs_and_is_recorded(corpus_file, tmp_path):
    results = train(tiny_mlm(corpus_file, "train.steps=2", "data.whole_word_mask=true"),
                    tmp_path / "run", progress=False)  # fmt: skip
    assert results["masking"]["whole_word"] is True


def test_presets_of_the_papers_resolve_and_validate():
    bert = validate(preset("luo-bert-base", "mlm"))
    assert (bert.model.num_layers, bert.model.dim, bert.model.num_heads) == (12, 768, 12)
    assert bert.optim.schedule == "linear" and bert.optim.warmup_steps == 20_000
    assert bert.train.batch_size == 2048 and bert.optim.lr == 2e-4 and bert.data.max_len == 512
    kl = validate(preset("kl-glue", "mlm"))
    assert (kl.model.num_layers, kl.model.dim, kl.model.num_heads) == (3, 300, 10)
    assert kl.optim.lr == 5e-4 and kl.optim.warmup_steps == 10_000 and kl.model.ffn_dim == 512
    for config in (bert, kl):  # the models build (on meta: no memory), with no warning
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("error")
            model = build_masked_lm(config, 260)
        assert model.max_len == 512 and len(model.encoder.layers) == config.model.num_layers


def test_fields_of_other_tasks_and_bad_shares_are_refused(corpus_file):
    with pytest.raises(ValueError, match=r"data\.block_size is not used by task mlm"):
        validate(tiny_mlm(corpus_file, "data.block_size=16"))
    with pytest.raises(ValueError, match=r"data\.mask_prob must be in"):
        validate(tiny_mlm(corpus_file, "data.mask_prob=1.5"))
    with pytest.raises(ValueError, match=r"data\.src is for task translation"):
        validate(tiny_mlm(corpus_file, 'data.src="de"'))


def test_the_command_line_trains_mlm_without_data_by_default(capsys):
    assert main(["train", "--task", "mlm", "--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["data"]["task"] == "mlm" and config["data"]["path"] is None
    assert config["optim"]["schedule"] == "linear" and config["data"]["max_len"] == 128
