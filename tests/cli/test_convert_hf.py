"""kattn convert --hf: a saved Hugging Face model converted, scored, saved and loaded back."""

import json
import math
import sys

import pytest
import torch

from kattn.cli import main
from kattn.train.hf_conversion import RECORD_FILE, convert_hf_checkpoint
from kattn.train.hf_evaluation import windows

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("kattn.hf")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny random GPT-2 (with a word-level tokenizer) and BERT, saved as save_pretrained
    writes them. A large initializer_range makes the attention sharp enough that replacing
    softmax is visible in the scores."""
    tokenizers = pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    gpt = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2,
                                  n_head=4, initializer_range=0.3, bos_token_id=0,
                                  eos_token_id=0)  # fmt: skip
    transformers.GPT2LMHeadModel(gpt).save_pretrained(root / "gpt2")
    words = ["the", "of", "is", "and", "query", "key", "value", "model", "text"]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    fast.save_pretrained(root / "gpt2")
    bert = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, initializer_range=0.3)  # fmt: skip
    transformers.BertForMaskedLM(bert).save_pretrained(root / "bert")
    return root


def test_softmax_keeps_the_scores(checkpoints):
    result = convert_hf_checkpoint(checkpoints / "gpt2", "softmax", max_tokens=256)
    assert result.kind == "causal-lm" and result.model_class == "GPT2LMHeadModel"
    assert math.isclose(result.after["perplexity"], result.before["perplexity"], rel_tol=1e-5)
    assert result.agreement["next_token_agreement"] == 1.0
    assert result.text["source"] == "embedded"


def test_causal_lm_converted_scored_saved_and_loaded_back(checkpoints, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the query of the key is the value and the model is text " * 40)
    out = tmp_path / "converted"
    argv = ["convert", "--hf", str(checkpoints / "gpt2"), "--to", "performer",
            "--attention-option", "num_features=32", "--text", str(text), "--length", "16",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"]["tokenizer"].startswith("its tokenizer")
    assert result["text"]["windows"] == 520 // 16  # 13 words a line, 40 lines
    before, after = result["before"]["perplexity"], result["after"]["perplexity"]
    assert math.isfinite(before) and math.isfinite(after) and abs(after - before) > 1e-3 * before
    assert 0 < result["agreement"]["next_token_agreement"] < 1
    assert result["reload_max_abs_diff"] == 0
    assert json.loads((out / RECORD_FILE).read_text())["after"] == result["after"]
    loaded = hf.from_pretrained(transformers.GPT2LMHeadModel, str(out))
    assert loaded.config.kattn == {"mechanism": "performer", "options": {"num_features": 32}}
    assert (out / "tokenizer.json").is_file()


def test_encoder_hidden_states_agree_less_after_the_conversion(checkpoints, tmp_path, capsys):
    out = tmp_path / "bert_performer"
    argv = ["convert", "--hf", str(checkpoints / "bert"), "--to", "auto", "--out", str(out),
            "--max-tokens", "256"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "(BertForMaskedLM, encoder) -> performer" in printed
    assert "bytes as token ids (no tokenizer in the checkpoint); 4 window(s) of 64" in printed
    record = json.loads((out / RECORD_FILE).read_text())
    assert 0.5 < record["agreement"]["mean_cosine"] < 0.9999
    assert record["agreement"]["relative_error"] > 1e-3
    assert record["reload_max_abs_diff"] == 0


def test_a_wordpiece_vocab_alone_is_the_tokenizer(checkpoints, tmp_path):
    """A BERT checkpoint whose tokenizer is only its vocab.txt: transformers builds BERT's
    tokenizer from it, so the text goes through it, not as bytes."""
    folder = tmp_path / "bert"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((checkpoints / "bert" / name).read_bytes())
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "query", "key", "value"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    result = convert_hf_checkpoint(folder, "softmax", max_tokens=64, length=16)
    assert result.text["tokenizer"] == "its tokenizer (BertTokenizer)"


def test_windows_fit_the_positions(tmp_path):
    """A --length beyond the model's positions is cut to them, RoBERTa's offset (positions
    numbered from pad_token_id + 1) included: 20 positions take windows of 18."""
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=20, pad_token_id=1)  # fmt: skip
    transformers.RobertaModel(config).save_pretrained(tmp_path)
    result = convert_hf_checkpoint(tmp_path, "softmax", length=64, max_tokens=100)
    assert (result.text["length"], result.text["windows"]) == (18, 100 // 18)
    assert result.agreement["mean_cosine"] == pytest.approx(1.0, abs=1e-6)


def test_refusals(checkpoints, tmp_path, capsys):
    assert main(["convert", "--hf", str(tmp_path), "--to", "performer"]) == 2
    assert "expected a folder written by save_pretrained" in capsys.readouterr().err
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # but no weights
    assert main(["convert", "--hf", str(tmp_path), "--to", "performer"]) == 2
    assert "is not a Hugging Face checkpoint" in capsys.readouterr().err
    argv = ["convert", "--hf", str(checkpoints / "bert"), "--to", "performer", "--only", "x"]
    assert main(argv) == 2
    assert "--only applies to --run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", "--hf", str(checkpoints / "bert"), "--run", "r", "--to", "performer"])


def test_a_missing_extra_is_one_error_line(checkpoints, monkeypatch, capsys):
    """Without kattn.hf (transformers not installed: None in sys.modules stops its import)
    the command says what to install in one line, exit code 2; an ImportError that names no
    extra is a fault and keeps its traceback."""
    argv = ["convert", "--hf", str(checkpoints / "bert"), "--to", "performer"]
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "kattn.hf", None)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kattn: error: converting a Hugging Face checkpoint needs kattn.hf")
    assert "pip install kattn[hf]" in err and err.count("\n") == 1

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'x' from 'y'")

    monkeypatch.setattr("kattn.cli.convert_hf.convert_hf_checkpoint", broken)
    with pytest.raises(ImportError, match="cannot import name"):
        main(argv)


def test_windows_cut_the_text_into_equal_pieces():
    ids = torch.arange(10)
    assert windows(ids, length=4, max_tokens=100).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert windows(ids, length=4, max_tokens=5).tolist() == [[0, 1, 2, 3]]
    assert windows(ids, length=32, max_tokens=100).shape == (1, 10)
    with pytest.raises(ValueError, match="at least 2"):
        windows(ids[:1], length=4, max_tokens=100)
