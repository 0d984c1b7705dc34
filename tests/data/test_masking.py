"""BERT's masking (kattn.data.masking) and the MLM vocabulary (kattn.data.mlm_vocab): the
shares on a seeded draw, specials and padding never chosen, whole words chosen together, the
special ids of each kind of tokenizer."""

from __future__ import annotations

import pytest
import torch

from kattn.data import ByteTokenizer, HFTokenizer, SentencePieceTokenizer
from kattn.data.masking import IGNORE_INDEX, MaskingConfig, mask_tokens
from kattn.data.mlm_vocab import WHITESPACE_BYTES, mlm_vocab

from .test_lm_data import bpe_file, sp_file  # noqa: F401  (the fixtures)

VOCAB = mlm_vocab(ByteTokenizer())
TEXT = (b"def masked(tokens, vocab):\n    return [t for t in tokens if t != 0]  # words\n") * 40


def byte_rows(rows: int = 64, length: int = 96, pad_from: int | None = None) -> torch.Tensor:
    """``rows`` sequences [CLS] bytes… [SEP] of ``length`` ids, padded after ``pad_from``."""
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8).long()
    body = torch.stack([data[i * 7 : i * 7 + length - 2] for i in range(rows)])
    tokens = torch.cat(
        [torch.full((rows, 1), VOCAB.cls_id), body, torch.full((rows, 1), VOCAB.sep_id)], dim=1
    )
    if pad_from is not None:
        tokens[:, pad_from:] = VOCAB.pad_id
        tokens[:, pad_from - 1] = VOCAB.sep_id
    return tokens


def draw(tokens: torch.Tensor, seed: int = 0, **config):
    return mask_tokens(tokens, VOCAB, torch.Generator().manual_seed(seed), MaskingConfig(**config))


def test_the_byte_vocabulary_appends_the_specials_after_the_bytes():
    assert VOCAB.special_ids == (256, 257, 258, 259) and VOCAB.vocab_size == 260
    assert VOCAB.ordinary_ids.tolist() == list(range(256)) and VOCAB.knows_words


def test_the_shares_are_berts_on_a_seeded_draw():
    tokens = byte_rows(400)
    masked = draw(tokens)
    ordinary = ~VOCAB.is_special(tokens)
    chosen = masked.chosen
    share = chosen.sum() / ordinary.sum()
    assert abs(float(share) - 0.15) < 0.005  # 37,600 ordinary tokens: std of the share ≈ 0.002
    n = int(chosen.sum())
    as_mask = int((masked.inputs[chosen] == VOCAB.mask_id).sum())
    kept = int((masked.inputs[chosen] == tokens[chosen]).sum())
    replaced = n - as_mask - kept  # a random draw equal to the original counts as kept
    assert abs(as_mask / n - 0.8) < 0.02
    assert abs(kept / n - 0.1 - 0.1 / 256) < 0.015 and abs(replaced / n - 0.1 + 0.1 / 256) < 0.015
    assert torch.equal(masked.labels[chosen], tokens[chosen])
    assert (masked.labels[~chosen] == IGNORE_INDEX).all()
    assert torch.equal(masked.inputs[~chosen], tokens[~chosen])  # nothing else changes
    random_ids = masked.inputs[chosen & (masked.inputs != VOCAB.mask_id)]
    assert (random_ids < 256).all()  # a random replacement is an ordinary token


def test_specials_and_padding_are_never_chosen_and_every_sequence_gets_one():
    tokens = byte_rows(200, pad_from=40)
    tokens[:50, 2:39] = VOCAB.pad_id  # rows with a single ordinary token
    masked = draw(tokens, mask_prob=0.5)
    special = VOCAB.is_special(tokens)
    assert not (masked.chosen & special).any()
    assert (masked.chosen.sum(dim=1) >= 1).all()
    assert (masked.chosen[:50].sum(dim=1) == 1).all()  # 1 ordinary token: ⌊0.5 + u⌋ ≥ 1
    assert torch.equal(masked.inputs[special], tokens[special])


def test_the_draw_is_a_function_of_the_generator():
    tokens = byte_rows(8)
    a, b, c = draw(tokens, seed=3), draw(tokens, seed=3), draw(tokens, seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.labels, c.labels)


def test_whole_word_masking_of_bytes_chooses_runs_of_non_whitespace_together():
    tokens = byte_rows(200)
    masked = draw(tokens, whole_word=True)
    starts = VOCAB.word_starts(tokens)
    word = torch.cumsum(starts.long(), dim=1)
    whitespace = torch.isin(tokens, torch.tensor(WHITESPACE_BYTES))
    for row in range(len(tokens)):
        for w in word[row].unique():
            members = word[row] == w
            picked = masked.chosen[row][members]
            assert picked.all() or not picked.any(), (row, int(w))
    after_break = whitespace[:, :-1] | VOCAB.is_special(tokens)[:, :-1]
    assert starts[:, 1:][after_break].all()  # a word never crosses whitespace or a special
    inside = ~starts & ~VOCAB.is_special(tokens)
    assert not (inside & whitespace).any()  # every whitespace byte is a unit of its own
    assert (masked.chosen & inside).any()  # words of several bytes were chosen whole
    share = masked.chosen.sum() / (~VOCAB.is_special(tokens)).sum()
    assert 0.10 < float(share) < 0.20  # 0.15 of the words; their lengths vary the token share


def test_word_starts_of_bytes():
    ids = list(b"ab  c\nde")
    tokens = torch.tensor([[VOCAB.cls_id, *ids, VOCAB.sep_id]])
    starts = VOCAB.word_starts(tokens)[0].tolist()
    #            [CLS] a     b      ' '   ' '   c     \n    d     e      [SEP]
    assert starts == [True, True, False, True, True, True, True, True, False, True]


def test_a_subword_vocabulary_marks_word_starts_and_appends_missing_specials(bpe_file):  # noqa: F811
    tokenizer = HFTokenizer(bpe_file)
    vocab = mlm_vocab(tokenizer)
    assert vocab.special_ids == tuple(range(300, 304)) and vocab.vocab_size == 304
    assert vocab.word_start is not None and vocab.word_start[300:].all()
    ids = tokenizer.encode("the masked tokens of a sentence")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    tokens = torch.tensor([[vocab.cls_id, *ids, vocab.sep_id]])
    starts = vocab.word_starts(tokens)[0, 1:-1].tolist()
    assert starts[1:] == [p.startswith("Ġ") for p in pieces][1:]
    assert starts[0]  # the first piece after [CLS] starts a word
    repeated = tokens.repeat(300, 1)
    masked = mask_tokens(repeated, vocab, torch.Generator().manual_seed(0),
                         MaskingConfig(whole_word=True))  # fmt: skip
    word = torch.cumsum(vocab.word_starts(repeated).long(), dim=1)
    for row in range(len(repeated)):
        for w in word[row].unique():
            picked = masked.chosen[row][word[row] == w]
            assert picked.all() or not picked.any()


def test_sentencepiece_keeps_its_own_bos_eos_and_marks_words_by_its_prefix(sp_file):  # noqa: F811
    tokenizer = SentencePieceTokenizer(sp_file)
    vocab = mlm_vocab(tokenizer)
    assert (vocab.cls_id, vocab.sep_id) == (1, 2)  # <s>, </s>
    assert (vocab.pad_id, vocab.mask_id, vocab.vocab_size) == (40, 41, 42)
    assert 1 not in vocab.ordinary_ids.tolist() and 0 in vocab.ordinary_ids.tolist()  # <unk>
    ids = tokenizer.encode("the masked tokens of a sentence")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    tokens = torch.tensor([[vocab.cls_id, *ids, vocab.sep_id]])
    starts = vocab.word_starts(tokens)[0, 1:-1].tolist()
    assert starts[1:] == [p.startswith("▁") for p in pieces][1:] and sum(starts) == 6


def test_a_tokenizer_with_its_own_specials_keeps_them(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "the": 5, "##s": 6}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "wp.json"))
    mlm = mlm_vocab(HFTokenizer(tmp_path / "wp.json"))
    assert mlm.special_ids == (0, 2, 3, 4) and mlm.vocab_size == 7
    assert mlm.ordinary_ids.tolist() == [1, 5, 6]
    tokens = torch.tensor([[2, 5, 6, 5, 3, 0]])
    assert mlm.word_starts(tokens)[0].tolist() == [True, True, False, True, True, True]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="mask_prob must be in"):
        MaskingConfig(mask_prob=0.0)
    with pytest.raises(ValueError, match="at most 1"):
        MaskingConfig(mask_token_share=0.8, random_token_share=0.3)
    with pytest.raises(ValueError, match=r"tokens must be \(B, L\) integer ids"):
        draw(torch.zeros(4, dtype=torch.long))


def test_a_bpe_vocabulary_with_hash_pieces_is_not_read_as_wordpiece():
    """A byte-level BPE learnt on code holds ``##`` pieces (comment rules): its words still
    start at ``Ġ``; a WordPiece vocabulary with a stray ``▁`` piece still continues at ``##``."""
    from kattn.data.mlm_vocab import _word_start_table

    bpe = ["ma", "sked", "Ġma", "sked", "##", "###", "Ġthe"]
    assert _word_start_table(bpe, 7, set()).tolist() == [
        False, False, True, False, False, False, True,
    ]  # fmt: skip
    wordpiece = ["the", "##s", "mask", "##ed", "▁"]
    assert _word_start_table(wordpiece, 5, set()).tolist() == [True, False, True, False, True]
