"""The piece ↔ id look-ups of every kind of tokenizer (``Tokenizer.token_to_id`` and
``id_to_token``), and the MLM vocabulary built from them alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kattn.data import ByteTokenizer, HFTokenizer, SentencePieceTokenizer
from kattn.data.mlm_vocab import mlm_vocab
from kattn.data.tokenizers import Tokenizer

from .test_lm_data import bpe_file, sp_file  # noqa: F401  (the fixtures)


def test_bytes_have_no_pieces() -> None:
    tokenizer = ByteTokenizer()
    assert tokenizer.token_to_id("a") is None and tokenizer.token_to_id("[MASK]") is None
    assert tokenizer.id_to_token(97) is None


def test_a_huggingface_file_looks_pieces_up_both_ways(bpe_file) -> None:  # noqa: F811
    tokenizer = HFTokenizer(bpe_file)
    ids = tokenizer.encode("the masked tokens of a sentence")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    assert all(isinstance(p, str) for p in pieces) and any(p.startswith("Ġ") for p in pieces)
    assert [tokenizer.token_to_id(p) for p in pieces] == ids
    assert tokenizer.token_to_id("[MASK]") is None  # the file has no such piece
    assert tokenizer.id_to_token(tokenizer.vocab_size) is None and tokenizer.id_to_token(-1) is None


def test_sentencepiece_looks_pieces_up_both_ways(sp_file) -> None:  # noqa: F811
    tokenizer = SentencePieceTokenizer(sp_file)
    assert (tokenizer.id_to_token(1), tokenizer.token_to_id("</s>")) == ("<s>", 2)
    ids = tokenizer.encode("the masked tokens of a sentence")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    assert [tokenizer.token_to_id(p) for p in pieces if p is not None] == ids
    assert tokenizer.token_to_id("[MASK]") is None  # not <unk>'s id: the piece is unknown
    assert tokenizer.id_to_token(tokenizer.vocab_size) is None


class WordTokenizer(Tokenizer):
    """Whitespace-separated words of a fixed list: a tokenizer of another library, known to
    kattn through the interface only."""

    name = kind = "words"

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(words)
        self.vocab_size = len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return " ".join(self.words[i] for i in values)

    def token_to_id(self, piece: str) -> int | None:
        return self.words.index(piece) if piece in self.words else None

    def id_to_token(self, i: int) -> str | None:
        return self.words[i] if 0 <= i < self.vocab_size else None


def test_the_mlm_vocabulary_reads_any_tokenizer_through_its_lookups() -> None:
    tokenizer = WordTokenizer(["<pad>", "<s>", "</s>", "▁the", "▁mask", "ed", "<mask>"])
    vocab = mlm_vocab(tokenizer)
    assert vocab.special_ids == (0, 1, 2, 6) and vocab.vocab_size == 7  # its own, none added
    assert vocab.ordinary_ids.tolist() == [3, 4, 5]
    tokens = torch.tensor([[1, 3, 4, 5, 2]])  # <s> ▁the ▁mask ed </s>
    assert vocab.word_starts(tokens)[0].tolist() == [True, True, True, False, True]
