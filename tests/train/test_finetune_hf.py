"""Task finetune from a local Hugging Face checkpoint (--from-hf): a tiny random BERT and a
tiny WordPiece tokenizer saved here (nothing downloaded) fine-tuned on files in AG News's
layout by kattn's loop (results.json with the metrics, the run resumed to the same end, the
saved model read back by kattn.hf and by kattn eval), softmax and performer, padded keys
changing nothing, pairs as BERT's tokenizer pairs them, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import kattn.hf  # noqa: E402
from kattn.cli import main  # noqa: E402
from kattn.data.text_examples import TextExamples  # noqa: E402
from kattn.train import apply_overrides, load_trained_model, preset  # noqa: E402
from kattn.train.config import RunConfig  # noqa: E402
from kattn.train.finetune import adopt_hf  # noqa: E402
from kattn.train.finetune_hf import HFClassifier  # noqa: E402
from kattn.train.finetune_hf_data import encode_hf, load_hf_task  # noqa: E402
from kattn.train.loop import Interrupted, train  # noqa: E402
from kattn.train.run import evaluate_saved_run  # noqa: E402

from ..data.test_glue import write_release  # noqa: E402
from . import test_finetune  # noqa: E402

WORDS = ("apple", "river", "stone")
#: the fixture of test_finetune: three classes in AG News's layout, a word of the text giving
#: the class away.
agnews = test_finetune.agnews
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LOOP = ["train.steps=4", "train.batch_size=8", "train.eval_every=2", "train.log_every=2",
        "optim.warmup_steps=1", "optim.lr=3e-3"]  # fmt: skip


def texts(n: int) -> list[str]:
    return [f"the {WORDS[i % 3]} of line {i} is here" for i in range(n)]


def save_tokenizer(folder: Path) -> object:
    """A WordPiece tokenizer of about 60 pieces learnt on the texts, as BERT's."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = tokenizers.normalizers.BertNormalizer()
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    trainer = tokenizers.trainers.WordPieceTrainer(vocab_size=60, special_tokens=SPECIALS)
    tok.train_from_iterator(texts(60), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    wrapped = transformers.BertTokenizerFast(tokenizer_object=tok)
    wrapped.save_pretrained(folder)
    return wrapped


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel (2 layers, width 16, 40 positions) and its tokenizer."""
    folder = tmp_path_factory.mktemp("bert")
    tokenizer = save_tokenizer(folder)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=40, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    return folder


def hf_config(start: Path, data: Path, *overrides: str, given: tuple[str, ...] = ()) -> RunConfig:
    config = preset("small", "finetune")
    config.data.path, config.model.init_from_hf, config.train.device = str(data), str(start), "cpu"
    apply_overrides(config, [*LOOP, *overrides])
    return adopt_hf(config, set(given))


def test_a_run_trains_resumes_and_saves_a_model(
    checkpoint: Path, agnews: Path, tmp_path: Path
) -> None:
    data = shutil.copytree(agnews, tmp_path / "data")  # deleted at the end
    config = hf_config(checkpoint, data)
    model = config.model
    assert (model.dim, model.num_layers, model.num_heads, model.ffn_dim) == (16, 2, 2, 32)
    assert (model.dropout, model.attention_dropout, model.pooling) == (0.1, 0.0, "mean")
    whole = train(config, tmp_path / "whole", progress=False)
    assert whole["task"] == "finetune" and whole["steps"] == 4
    assert whole["init_from_hf"] == str(checkpoint) and whole["init_from"] is None
    assert 0.0 <= whole["test_metrics"]["accuracy"] <= 1.0
    assert whole["baseline_test_metrics"]["accuracy"] == pytest.approx(5 / 15)
    assert whole["data"]["max_len"] == 40 and whole["data"]["sizes"]["test"] == 15
    saved = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert saved["test_metrics"] == whole["test_metrics"]

    with pytest.raises(Interrupted):
        train(config, tmp_path / "split", progress=False, stop_after=2)
    resumed = train(config, tmp_path / "split", resume=True, progress=False)
    assert resumed["test_metrics"] == whole["test_metrics"]
    assert resumed["best_valid_loss"] == whole["best_valid_loss"]

    # the saved model: kattn.hf reads it, kattn eval and load_trained_model rebuild it
    files = tmp_path / "whole" / "hf"
    assert whole["hf_model"] == str(files) and (files / "model.safetensors").is_file()
    labels = json.loads((files / "config.json").read_text())["id2label"]
    assert labels == {"0": "1", "1": "2", "2": "3"}  # the task's classes, in kattn's order
    cls = transformers.AutoModelForSequenceClassification
    model = kattn.hf.from_pretrained(cls, str(files)).eval()
    trained, _, tokenizer = load_trained_model(tmp_path / "whole")
    assert tokenizer is None and isinstance(trained, HFClassifier)
    tokens = torch.tensor([[2, 10, 11, 12, 3]])
    torch.testing.assert_close(model(input_ids=tokens).logits, trained(tokens))
    again = evaluate_saved_run(tmp_path / "whole", "test")
    assert again["loss"] == pytest.approx(whole["test_loss"], rel=1e-6)
    # the run folder alone gives the model: its hf/config.json holds the head
    shutil.rmtree(data)
    alone, _, _ = load_trained_model(tmp_path / "whole")
    torch.testing.assert_close(alone(tokens), trained(tokens), rtol=0, atol=0)


def test_command_line_runs_performer(checkpoint: Path, agnews: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main([
        "train", "--task", "finetune", "--from-hf", str(checkpoint), "--data", str(agnews),
        "--attention", "performer", "--attention-option", "num_features=8", "--steps", "2",
        "--batch-size", "8", "--eval-every", "2", "--out", str(out), "--device", "cpu",
        "--no-progress", "--set", "data.max_len=24", "--set", "optim.warmup_steps=1",
    ])  # fmt: skip
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["mechanism"] == "performer" and results["steps"] == 2
    assert results["config"]["model"]["init_from_hf"] == str(checkpoint)
    assert results["data"]["max_len"] == 24 and "accuracy" in results["test_metrics"]
    recorded = json.loads((out / "hf" / "config.json").read_text())["kattn"]
    assert recorded == {"mechanism": "performer", "options": {"num_features": 8}}


def test_stsb_is_a_regression_of_pairs(checkpoint: Path, tmp_path: Path) -> None:
    root = write_release(tmp_path / "glue", ("STS-B",))
    rows = (root / "STS-B" / "train.tsv").read_text().splitlines()
    extra = [f"{i}\tg\tf\ty\t0\tn\tn\tthe apple {i}.\tthe stone.\t{i % 6 * 0.9:.1f}"
             for i in range(20)]  # fmt: skip
    (root / "STS-B" / "train.tsv").write_text("\n".join(rows + extra) + "\n")
    config = hf_config(checkpoint, root, 'data.glue="STS-B"', "train.steps=2")
    results = train(config, tmp_path / "run", progress=False)
    assert results["metric_names"] == ["pearson", "spearman"]
    assert results["test_accuracy"] is None and results["best_valid_loss"] > 0
    saved = json.loads((tmp_path / "run" / "hf" / "config.json").read_text())
    assert saved["problem_type"] == "regression" and len(saved["id2label"]) == 1


@pytest.mark.parametrize("mechanism", ["softmax", "performer"])
def test_padded_keys_change_nothing(checkpoint: Path, mechanism: str) -> None:
    torch.manual_seed(0)
    cls = transformers.AutoModelForSequenceClassification
    hf = kattn.hf.from_pretrained(cls, str(checkpoint), mechanism, num_labels=3)
    model = HFClassifier(hf).double().eval()
    short, long = [2, 10, 11, 3], [2, 12, 13, 14, 15, 16, 3]
    alone = model(torch.tensor([short]))
    rows = torch.tensor([[*short, 20, 21, 22], long])  # the padding holds ordinary ids
    padding = torch.arange(7)[None, :] >= torch.tensor([[4], [7]])
    batched = model(rows, padding)
    torch.testing.assert_close(batched[0], alone[0], rtol=1e-12, atol=1e-12)
    garbage = model(torch.tensor([[*short, 30, 31, 32], long]), padding)
    torch.testing.assert_close(garbage, batched, rtol=1e-12, atol=1e-12)


def test_penalties_are_the_mechanisms_of_every_layer(checkpoint: Path) -> None:
    """The classifier lists its kattn modules once: one per layer, whose penalties (OGLU's
    orthogonality, made non-zero here) it sums."""
    torch.manual_seed(0)
    cls = transformers.AutoModelForSequenceClassification
    hf = kattn.hf.from_pretrained(cls, str(checkpoint), "ffk_oglu", num_labels=3)
    model = HFClassifier(hf).double()
    found = [m for m in hf.modules() if isinstance(m, kattn.Attention)]
    assert len(found) == 2 and list(model.mechanisms) == found
    assert model.state_dict().keys() == {f"hf.{k}" for k in hf.state_dict()}
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    each = [m.regularization_loss() for m in found]
    assert all(p.item() > 1e-6 for p in each)
    torch.testing.assert_close(model.regularization_loss(), sum(each), rtol=1e-12, atol=0)


def test_pairs_are_paired_as_the_tokenizer_pairs_them(checkpoint: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    first, second = ("the apple", "stone"), ("the river of line 7 is here", "is here the stone")
    examples = TextExamples([first[0], second[0]], [1.5, 3.0], [first[1], second[1]])
    own = tokenizer(*first)
    n = len(own["input_ids"])
    assert len(tokenizer(*second)["input_ids"]) > n + 2
    rows, full = encode_hf(examples, tokenizer, max_len=n + 2)
    assert rows.tokens[0, :n].tolist() == own["input_ids"] and rows.lengths.tolist() == [n, n + 2]
    assert rows.tokens[0, n:].tolist() == [tokenizer.pad_token_id] * 2 and full == 1
    assert rows.types is not None and rows.types[0, :n].tolist() == own["token_type_ids"]
    assert set(own["token_type_ids"]) == {0, 1}  # BERT's segments
    sep = tokenizer.convert_tokens_to_ids("[SEP]")
    assert rows.tokens[1].tolist().count(sep) == 2  # cut, still a pair
    assert rows.labels.dtype == torch.float32


def test_refusals(
    checkpoint: Path, agnews: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"  # a checkpoint without its tokenizer
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, bare / name)
    with pytest.raises(ValueError, match=r"no tokenizer files.*save_pretrained"):
        hf_config(bare, agnews)
    with pytest.raises(ValueError, match="is not a Hugging Face checkpoint"):
        hf_config(agnews, agnews)  # a folder, but of data
    with pytest.raises(ValueError, match=r"model.dim is 64 here and 16 for the checkpoint"):
        hf_config(checkpoint, agnews, "model.dim=64", given=("model.dim",))
    with pytest.raises(ValueError, match=r"data.max_len \(64\) exceeds the 40 positions"):
        train(hf_config(checkpoint, agnews, "data.max_len=64"), tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match=r"data\.tokenizer \(--tokenizer\) is not used"):
        hf_config(checkpoint, agnews, f"data.tokenizer={checkpoint / 'tokenizer.json'}")
    both = ["train", "--task", "finetune", "--from-hf", str(checkpoint), "--from", str(tmp_path)]
    capsys.readouterr()
    assert main([*both, "--print-config"]) == 2
    assert "are two starts of one fine-tuning: give one" in capsys.readouterr().err
    assert main(["train", "--task", "mlm", "--from-hf", str(checkpoint), "--print-config"]) == 2
    assert "--from-hf is for task finetune, not mlm" in capsys.readouterr().err


def test_a_wordpiece_vocab_alone_is_the_tokenizer(
    checkpoint: Path, agnews: Path, tmp_path: Path
) -> None:
    """A checkpoint whose tokenizer is only its vocab.txt (BERT's WordPiece vocabulary) is
    started from: transformers builds BERT's tokenizer from it, which encodes as the saved
    one."""
    start = tmp_path / "vocab-only"
    start.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, start / name)
    vocab = transformers.AutoTokenizer.from_pretrained(checkpoint).get_vocab()
    (start / "vocab.txt").write_text("".join(f"{t}\n" for t in sorted(vocab, key=vocab.get)))
    ours, theirs = (load_hf_task(hf_config(s, agnews)) for s in (start, checkpoint))
    assert type(ours.tokenizer).__name__ == "BertTokenizer"
    assert torch.equal(ours.splits["train"].tokens, theirs.splits["train"].tokens)


def test_a_classifier_over_other_labels_is_refused(checkpoint: Path, agnews: Path, tmp_path):
    """A checkpoint that already classifies into other labels (or the same in another order)
    would keep its head under kattn's class numbers: refused."""
    start = tmp_path / "classifier"
    shutil.copytree(checkpoint, start)
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    config.num_labels, config.id2label = 3, {0: "3", 1: "1", 2: "2"}
    config.label2id = {v: k for k, v in config.id2label.items()}
    transformers.BertForSequenceClassification(config).save_pretrained(start)
    with pytest.raises(ValueError, match="already a sequence classifier over the labels"):
        train(hf_config(start, agnews), tmp_path / "run", progress=False)


def test_limits_of_the_checkpoint(checkpoint: Path) -> None:
    """RoBERTa numbers positions from pad_token_id + 1, so it takes fewer tokens than its
    position table; a model config whose pad id is not the tokenizer's is refused."""
    from kattn.train.finetune_hf_data import check_pad_ids, hf_max_len

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.model_max_length = int(1e30)
    config = preset("small", "finetune")
    config.data.max_len = None
    roberta = transformers.RobertaConfig(max_position_embeddings=40, pad_token_id=1)
    assert hf_max_len(config, roberta, tokenizer) == 38
    bert = transformers.BertConfig(max_position_embeddings=40)
    assert hf_max_len(config, bert, tokenizer) == 40
    check_pad_ids(bert, tokenizer, checkpoint)  # BERT's pad id 0 is the tokenizer's
    with pytest.raises(ValueError, match="pad_token_id is 7 and the tokenizer pads with 0"):
        check_pad_ids(transformers.GPT2Config(pad_token_id=7), tokenizer, checkpoint)


def test_positions_of_each_family() -> None:
    """The positions a model takes (hf_positions: --from-hf's longest sequence, and kattn
    convert --hf's longest window), RoBERTa's offset included."""
    from kattn.train.hf_positions import hf_positions

    assert hf_positions(transformers.RobertaConfig(max_position_embeddings=514)) == 512
    assert hf_positions(transformers.GPT2Config(n_positions=64)) == 64
    assert hf_positions(transformers.BertConfig(max_position_embeddings=40)) == 40
