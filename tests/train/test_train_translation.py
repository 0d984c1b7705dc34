"""``kattn train --task translation``: a tiny encoder–decoder through the one training loop on
an IWSLT'14-layout folder and on two aligned files the tests write — results with BLEU, the
run folder's vocabulary, ``kattn translate``, the attention plan of the three attentions,
presets and refusals."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from kattn.cli import main
from kattn.nn import Seq2Seq
from kattn.train import apply_overrides, load_trained_model, preset
from kattn.train.bleu import Decoding, corpus_bleu, translate_texts
from kattn.train.config import RunConfig
from kattn.train.loop import train
from kattn.train.translation import attention_plan, build_seq2seq
from kattn.train.validation import validate

WORDS = [f"wort{i}" for i in range(24)]


def sentence_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """A toy language pair: the target is the source word by word through a fixed dictionary
    (``wortK`` → ``wordK``), so a model can learn it in a few dozen steps."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 7))]
        pairs.append((" ".join(words), " ".join(w.replace("wort", "word") for w in words)))
    return pairs


def write_iwslt(folder: Path, sizes: tuple[int, int, int] = (400, 40, 40)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for seed, (split, n) in enumerate(zip(("train", "valid", "test"), sizes, strict=True)):
        pairs = sentence_pairs(n, seed)
        (folder / f"{split}.de").write_text("".join(f"{s}\n" for s, _ in pairs), "utf-8")
        (folder / f"{split}.en").write_text("".join(f"{t}\n" for _, t in pairs), "utf-8")
    return folder


@pytest.fixture(scope="module")
def iwslt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_iwslt(tmp_path_factory.mktemp("iwslt"))


def tiny_mt(path: Path, *overrides: str) -> RunConfig:
    config = preset("small", "translation")
    config.data.path = str(path)
    config.train.device = "cpu"
    return apply_overrides(
        config,
        [
            "model.dim=32", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=64",
            "data.bpe_size=300", "data.max_tokens=256", "train.steps=30",
            "train.eval_every=15", "train.log_every=15", "train.beam_size=2",
            "train.bleu_examples=20", "optim.warmup_steps=3", "optim.lr=5e-3", *overrides,
        ],
    )  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(iwslt_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "mt"
    train(validate(tiny_mt(iwslt_dir)), run, progress=False)
    return run


def test_a_run_writes_bleu_losses_and_its_vocabulary(finished_run: Path) -> None:
    results = json.loads((finished_run / "results.json").read_text())
    assert results["task"] == "translation"
    for key in ("test_loss", "test_perplexity", "test_accuracy", "best_valid_loss",
                "valid_bleu", "test_bleu", "copy_source_test_bleu", "tokens_per_s"):  # fmt: skip
        assert math.isfinite(results[key]), key
    assert results["bleu"]["test"]["model"]["sentences"] == 20
    assert results["bleu"]["decoding"]["beam_size"] == 2
    assert results["data"]["pairs"] == {"train": 400, "valid": 40, "test": 40}
    assert len(results["data"]["pairs_sha256"]) == 64
    assert (finished_run / "tokenizer.json").is_file()
    # it learnt: the NLL fell well below that of a uniform guess over the vocabulary
    assert results["test_loss"] < 0.6 * math.log(results["data"]["vocab_size"])


def test_the_run_folder_alone_translates(finished_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.de"
    source.write_text("wort1 wort2\nwort3\n", "utf-8")
    out = tmp_path / "out.en"
    assert main(["translate", "--run", str(finished_run), "--input", str(source),
                 "--output", str(out), "--beam", "1"]) == 0  # fmt: skip
    assert len(out.read_text("utf-8").splitlines()) == 2
    model, config, bpe = load_trained_model(finished_run)
    assert isinstance(model, Seq2Seq) and config.data.task == "translation"
    greedy = translate_texts(model, bpe, ["wort1 wort2", "wort3"], Decoding(beam_size=1))
    assert out.read_text("utf-8").splitlines() == greedy


def test_translate_refuses_other_runs_and_missing_input(finished_run: Path, capsys) -> None:
    assert main(["translate", "--run", str(finished_run), "--input", "/nonexistent"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["translate", "--run", str(finished_run), "--input", "-", "--beam", "0"]) == 2


def test_two_aligned_files_are_a_corpus(tmp_path: Path) -> None:
    pairs = sentence_pairs(300, 7)
    (tmp_path / "corpus.de").write_text("".join(f"{s}\n" for s, _ in pairs), "utf-8")
    (tmp_path / "corpus.en").write_text("".join(f"{t}\n" for _, t in pairs), "utf-8")
    steps = ("train.steps=2", "train.eval_every=2", "optim.warmup_steps=1")
    config = tiny_mt(tmp_path / "corpus", *steps)
    results = train(validate(config), tmp_path / "run", progress=False)
    sizes = results["data"]["pairs"]
    assert sum(sizes.values()) == 300 and min(sizes.values()) > 0


def test_a_missing_corpus_names_both_layouts(tmp_path: Path) -> None:
    config = tiny_mt(tmp_path / "nothing")
    with pytest.raises(ValueError, match="IWSLT'14 folder"):
        train(validate(config), tmp_path / "run", progress=False)


def test_the_cross_attention_drops_the_relative_encoding_by_default() -> None:
    config = preset("luo-mt", "translation")
    plan = attention_plan(config)
    assert plan["encoder_attention"] == plan["decoder_attention"] == "nprf_rpe"
    assert plan["cross_options"]["rpe"] is None and plan["cross_options"]["num_features"] == 24
    assert plan["encoder_options"]["num_features"] == 16
    assert plan["decoder_options"]["num_features"] == 24
    apply_overrides(config, ["attention.cross=softmax", "attention.cross_options={}"])
    assert attention_plan(config)["cross_options"] == {"num_features": 16}


def test_the_default_cross_attention_leaves_the_encodings_options_behind() -> None:
    config = apply_overrides(
        preset("small", "translation"),
        ["attention.name=nprf_rpe", "attention.options.rpe=decay",
         "attention.options.decay_terms=2", "attention.options.num_features=8"],
    )  # fmt: skip
    plan = attention_plan(validate(config))
    assert plan["cross_options"] == {"rpe": None, "num_features": 8}
    assert plan["decoder_options"]["decay_terms"] == 2
    build_seq2seq(config, 300)  # builds: no encoding option reaches the cross-attention


@pytest.mark.parametrize(
    "overrides",
    [["attention.cross=nprf_rpe"], ["attention.cross_options.rpe=toeplitz"]],
)
def test_a_cross_attention_encoding_is_refused_before_training(overrides: list[str]) -> None:
    config = apply_overrides(preset("small", "translation"), ["attention.name=nprf_rpe"])
    with pytest.raises(ValueError, match=r"cross_options\.rpe=null"):
        validate(apply_overrides(config, overrides))


def test_the_paper_preset_drops_its_feature_counts_for_softmax(capsys) -> None:
    from kattn.train.run import TrainOptions, resolve_config

    config, dropped = resolve_config(
        TrainOptions(task="translation", data="x", attention="softmax")
    )
    assert config.attention.decoder_options == config.attention.cross_options == {}
    assert "decoder_options.num_features=24" in dropped
    build_seq2seq(validate(config), 300)


def test_token_batches_are_not_merged_into_bigger_ones(iwslt_dir: Path, tmp_path: Path) -> None:
    config = tiny_mt(iwslt_dir, "train.batch_size=2")
    with pytest.raises(ValueError, match=r"optim\.accumulate"):
        train(validate(config), tmp_path / "run", progress=False)
    config = tiny_mt(iwslt_dir, "train.batch_size=2", "optim.accumulate=2", "train.steps=1",
                     "train.eval_every=1", "train.bleu_examples=2")  # fmt: skip
    assert train(validate(config), tmp_path / "run2", progress=False)["steps"] == 1


def test_mechanisms_are_chosen_per_attention() -> None:
    config = apply_overrides(
        preset("small", "translation"),
        ["attention.decoder=performer", "attention.decoder_options.num_features=8"],
    )
    model = build_seq2seq(config, 300)
    layer = model.decoder_layers()[0]
    assert type(layer.self_attn.attention).__name__ == "KernelizedAttention"
    assert layer.self_attn.attention.feature_map.num_features == 8
    assert type(layer.cross_attn.attention).__name__ == "SoftmaxAttention"
    assert type(model.encoder.layers[0].attn.attention).__name__ == "SoftmaxAttention"


def test_label_smoothing_is_the_training_loss_only(iwslt_dir: Path, tmp_path: Path) -> None:
    from kattn.train.translation import Translation

    config = tiny_mt(iwslt_dir)
    objective = Translation(config, Translation.load_data(config))
    torch.manual_seed(0)
    model = objective.build_model(config).eval()
    batch = objective.batch("valid", torch.tensor([0]), torch.device("cpu"))
    logits = objective.forward(model, batch)
    n = int((batch["tgt_out"] != 0).sum())
    smoothed, nll = objective.loss(logits, batch), objective.loss(logits, batch, "sum") / n
    plain = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=0
    )
    torch.testing.assert_close(nll, plain)
    assert not torch.allclose(smoothed, plain)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.block_size=16"], "not used by task translation"),
        (["optim.label_smoothing=1.0"], "label_smoothing"),
        (["train.beam_size=0"], "beam_size"),
        (["attention.decoder=nonexistent"], "nonexistent"),
        (["data.max_tokens=100"], "at least data.max_len"),
        (["data.bpe_size=100"], "260"),
        (["train.bleu_examples=0"], "bleu_examples"),
    ],
)
def test_bad_translation_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(apply_overrides(preset("small", "translation"), overrides))


def test_translation_fields_are_refused_elsewhere() -> None:
    with pytest.raises(ValueError, match=r"data\.src is for task translation"):
        validate(apply_overrides(preset("small", "listops"), ["data.src=de"]))
    with pytest.raises(ValueError, match=r"attention\.decoder is for task translation"):
        validate(apply_overrides(preset("small", "lm"), ["attention.decoder=softmax"]))
    with pytest.raises(ValueError, match=r"optim\.label_smoothing is for task translation"):
        validate(apply_overrides(preset("small", "lm"), ["optim.label_smoothing=0.1"]))


def test_bleu_is_sacrebleus_corpus_score() -> None:
    refs = ["the cat sat on the mat", "a dog barked loudly today"]
    assert corpus_bleu(refs, refs)["bleu"] == pytest.approx(100.0)
    assert corpus_bleu(["x y z", "q r s"], refs)["bleu"] < 1.0
    with pytest.raises(ValueError, match="2 references"):
        corpus_bleu(["one"], refs)
