"""Language-modelling data: tokenizers (bytes, a BPE and a sentencepiece model trained here),
corpus layouts (file, folder of .txt, WikiText), the embedded standard-library corpus,
tokenised splits and the unigram baseline."""

from __future__ import annotations

import hashlib
import math
import random
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from kattn.data import (
    ByteTokenizer,
    DataFormatError,
    HFTokenizer,
    SentencePieceTokenizer,
    load_corpus,
    load_tokenizer,
    split_bytes,
    stdlib_corpus,
    stdlib_files,
    tokenize_corpus,
    unigram_bits_per_byte,
)
from kattn.data import tokenizers as tokenizers_module
from kattn.data.corpus import EMBEDDED_CORPUS_BYTES, STDLIB_EXCLUDED, Corpus

WORDS = (
    "the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "from", "big",
    "red", "houses", "near", "old", "trees",
)  # fmt: skip


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def write_text(path: Path, lines: int = 200, seed: int = 0) -> bytes:
    data = "".join(line + "\n" for line in sentences(lines, seed)).encode()
    path.write_bytes(data)
    return data


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (vocabulary 300) trained on generated sentences."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences(500), trainer)
    path = tmp_path_factory.mktemp("bpe") / "bpe.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def sp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentencepiece unigram model (vocabulary 40) trained on generated sentences."""
    sentencepiece = pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("sp")
    write_text(folder / "train.txt", lines=500)
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "train.txt"),
        model_prefix=str(folder / "sp"),
        vocab_size=40,
        character_coverage=1.0,
        minloglevel=2,
    )
    return folder / "sp.model"


# --- tokenizers ----------------------------------------------------------------------------


def test_bytes_round_trip_and_compact_ids():
    tokenizer = load_tokenizer(None)
    assert isinstance(tokenizer, ByteTokenizer) and tokenizer.vocab_size == 256
    text = "naïve café — 日本\n\x00end"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8")) and tokenizer.decode(ids) == text
    array = tokenizer.encode_array(text.encode())
    assert array.dtype == torch.uint8 and array.tolist() == ids
    assert tokenizer.decode(torch.tensor([0x63, 0xFF, 0x61])) == "c\ufffda"  # invalid: replaced
    assert tokenizer.bytes_level and tokenizer.save("anywhere") is None


def test_a_bpe_json_file_round_trips(bpe_file, tmp_path, monkeypatch):
    tokenizer = load_tokenizer(bpe_file)
    assert isinstance(tokenizer, HFTokenizer) and not tokenizer.bytes_level
    assert tokenizer.vocab_size == 300
    text = "the red cat ran far\nold dogs sat near the mat\n"
    ids = tokenizer.encode(text)
    assert len(ids) < len(text.encode()) and tokenizer.decode(ids) == text
    # long texts are encoded a piece at a time, cut after newlines: the same ids
    monkeypatch.setattr(tokenizers_module, "ENCODE_CHUNK_CHARS", 16)
    monkeypatch.setattr(tokenizers_module, "ENCODE_BATCH", 2)
    array = tokenizer.encode_array(text * 3)
    assert array.dtype == torch.int32 and array.tolist() == tokenizer.encode(text * 3)
    assert tokenizer.save(tmp_path) == "tokenizer.json"
    assert (tmp_path / "tokenizer.json").read_bytes() == bpe_file.read_bytes()
    info = tokenizer.describe()
    assert info["kind"] == "huggingface" and info["vocab_size"] == 300
    assert info["sha256"] == hashlib.sha256(bpe_file.read_bytes()).hexdigest()


def test_a_sentencepiece_model_round_trips(sp_file, tmp_path):
    tokenizer = load_tokenizer(sp_file)
    assert isinstance(tokenizer, SentencePieceTokenizer) and tokenizer.vocab_size == 40
    text = "the cat sat on a mat"
    ids = tokenizer.encode(text)
    assert 0 < len(ids) < len(text) and tokenizer.decode(ids) == text
    assert tokenizer.encode_array(text).tolist() == ids
    assert tokenizer.encode_batch([text, "a mat"]) == [ids, tokenizer.encode("a mat")]
    assert tokenizer.save(tmp_path) == "tokenizer.model"
    assert load_tokenizer(tmp_path / "tokenizer.model").encode(text) == ids


def test_unknown_missing_and_unreadable_tokenizer_files(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"vocab\.txt.*\.json.*\.model"):
        load_tokenizer(tmp_path / "vocab.txt")
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a HuggingFace tokenizer"):
        load_tokenizer(tmp_path / "broken.json")
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # as if not installed
    (tmp_path / "x.model").write_bytes(b"")
    with pytest.raises(ImportError, match=r"kattn\[text\]"):
        load_tokenizer(tmp_path / "x.model")


# --- corpora -------------------------------------------------------------------------------


def test_a_text_file_is_split_90_5_5_at_line_boundaries(tmp_path):
    data = write_text(tmp_path / "corpus.txt", lines=400)
    corpus = load_corpus(tmp_path / "corpus.txt")
    assert corpus.train + corpus.valid + corpus.test == data
    assert corpus.train.endswith(b"\n") and corpus.valid.endswith(b"\n")
    longest = max(len(line) for line in data.splitlines(keepends=True))
    assert abs(len(corpus.train) - 0.9 * len(data)) <= longest
    assert abs(len(corpus.valid) - 0.05 * len(data)) <= longest
    info = corpus.info
    assert info["layout"] == "file" and info["files"] == ["corpus.txt"]
    assert info["sha256"] == hashlib.sha256(data).hexdigest()
    assert info["bytes"] == {"train": len(corpus.train), "valid": len(corpus.valid),
                             "test": len(corpus.test)}  # fmt: skip


def test_split_without_newlines_cuts_at_character_boundaries():
    data = "é".encode() * 100  # two bytes per character
    parts = split_bytes(data)
    assert b"".join(parts) == data
    assert all(len(p) % 2 == 0 and p.decode() for p in parts)
    with pytest.raises(DataFormatError, match="too short"):
        split_bytes(b"a\nb\n")


def test_a_folder_of_txt_files_in_sorted_order(tmp_path):
    root = tmp_path / "texts"
    (root / "b").mkdir(parents=True)
    (root / "b" / "2.txt").write_bytes(b"second of b\n")
    (root / "a.txt").write_bytes(b"first, no newline")
    (root / "b" / "1.txt").write_bytes("".join(s + "\n" for s in sentences(100)).encode())
    (root / "notes.md").write_bytes(b"not read\n")
    corpus = load_corpus(root)
    whole = corpus.train + corpus.valid + corpus.test
    expected = b"first, no newline\n" + (root / "b" / "1.txt").read_bytes() + b"second of b\n"
    assert whole == expected
    assert corpus.info["layout"] == "folder" and corpus.info["num_files"] == 3
    assert corpus.info["files"] == ["a.txt", "b/1.txt", "b/2.txt"]
    assert load_corpus(root).info["sha256"] == corpus.info["sha256"]
    assert corpus.info["sha256"] == hashlib.sha256(expected).hexdigest()


@pytest.mark.parametrize("variant", ["tokens", "raw"])
def test_the_wikitext_layout_gives_its_three_splits(tmp_path, variant):
    texts = {}
    for seed, split in enumerate(("train", "valid", "test")):
        texts[split] = write_text(tmp_path / f"wiki.{split}.{variant}", lines=5, seed=seed)
    corpus = load_corpus(tmp_path)
    assert (corpus.train, corpus.valid, corpus.test) == (
        texts["train"], texts["valid"], texts["test"]
    )  # fmt: skip
    assert corpus.info["layout"] == f"wikitext-{variant}"
    (tmp_path / f"wiki.valid.{variant}").unlink()
    with pytest.raises(DataFormatError, match=rf"wiki\.valid\.{variant}"):
        load_corpus(tmp_path)


def test_missing_and_empty_corpora_name_the_file(tmp_path):
    with pytest.raises(DataFormatError, match=r"nowhere\.txt does not exist"):
        load_corpus(tmp_path / "nowhere.txt")
    (tmp_path / "empty.txt").write_bytes(b"  \n")
    with pytest.raises(DataFormatError, match=r"empty\.txt is empty"):
        load_corpus(tmp_path / "empty.txt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataFormatError, match=r"no \.txt files"):
        load_corpus(tmp_path / "folder")
    (tmp_path / "wiki.train.tokens").write_bytes(b"x\n" * 10)
    (tmp_path / "wiki.valid.tokens").write_bytes(b"")
    (tmp_path / "wiki.test.tokens").write_bytes(b"x\n")
    with pytest.raises(DataFormatError, match=r"wiki\.valid\.tokens is empty"):
        load_corpus(tmp_path)


def test_the_embedded_corpus_is_the_stdlib_without_tests_and_deterministic():
    first, second = stdlib_corpus(200_000), stdlib_corpus(200_000)
    assert first.info["sha256"] == second.info["sha256"]
    assert first.train == second.train and first.test == second.test
    info = first.info
    assert info["layout"] == "stdlib" and info["python_version"] == sys.version.split()[0]
    assert info["path"] == sysconfig.get_paths()["stdlib"]
    assert sum(info["bytes"].values()) <= 200_000 and info["num_files"] == len(info["files"])
    root = Path(info["path"])
    files = [f.relative_to(root) for f in stdlib_files(root)]
    assert files and all(not STDLIB_EXCLUDED.intersection(f.parts[:-1]) for f in files)
    assert Path("os.py") in files and not any(f.parts[0] == "test" for f in files)
    assert files == sorted(files, key=lambda p: p.as_posix())
    assert info["files"] == [f.as_posix() for f in files[: len(info["files"])]]
    assert load_corpus(None, max_bytes=200_000).info["sha256"] == info["sha256"]
    assert EMBEDDED_CORPUS_BYTES == 4_000_000


# --- tokenised splits ----------------------------------------------------------------------


def test_tokenised_splits_are_compact_and_count_bytes(tmp_path, bpe_file):
    write_text(tmp_path / "c.txt", lines=300)
    corpus = load_corpus(tmp_path / "c.txt")
    data = tokenize_corpus(corpus, ByteTokenizer())
    assert data.train.dtype == torch.uint8 and data.train.tolist() == list(corpus.train)
    assert data.vocab_size == 256 and data.bytes_per_token("valid") == 1.0
    assert data.info["sha256"] == corpus.info["sha256"]
    bpe = tokenize_corpus(corpus, load_tokenizer(bpe_file))
    assert bpe.valid.dtype == torch.int32 and bpe.num_bytes["valid"] == len(corpus.valid)
    assert bpe.bytes_per_token("valid") == len(corpus.valid) / len(bpe.valid) > 1
    assert "estimated" in bpe.info["bits_per_byte"]


def test_unigram_baseline_is_add_one_smoothed_cross_entropy():
    corpus = Corpus(b"aab\n", b"ab", b"b", {})
    data = tokenize_corpus(corpus, ByteTokenizer())
    counts = {ord("a"): 3, ord("b"): 2, ord("\n"): 2}  # 1 + training count
    total = 4 + 256
    nats = -(math.log(counts[ord("a")] / total) + math.log(counts[ord("b")] / total))
    assert unigram_bits_per_byte(data) == pytest.approx(nats / math.log(2) / 2)
