"""The vocabulary of masked language modelling: a tokenizer's ids plus the special tokens
[PAD], [CLS], [SEP] and [MASK], and where words start (for whole-word masking).

A tokenizer that has its own special tokens keeps them (BERT's ``[PAD]`` … ``[MASK]`` or
RoBERTa's ``<pad>``, ``<s>``, ``</s>``, ``<mask>``); the missing ones are appended after its
vocabulary in that order, so UTF-8 bytes get [PAD] = 256, [CLS] = 257, [SEP] = 258 and
[MASK] = 259 (a vocabulary of 260).

Word boundaries (Devlin et al. 2019's whole-word masking): for bytes, a word is a maximal run
of non-whitespace bytes (each whitespace byte is a unit of its own); for subword tokenizers, a
piece starts a word when it carries the word-start marker (sentencepiece's ``▁``, byte-level
BPE's ``Ġ``, or a WordPiece piece without the ``##`` continuation prefix). A special token
always stands alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .tokenizers import Tokenizer

#: the special tokens, in the order they are appended after a vocabulary that lacks them.
SPECIAL_NAMES = ("pad", "cls", "sep", "mask")
#: the spellings of each special token that a tokenizer's own vocabulary may hold.
SPECIAL_SPELLINGS = {
    "pad": ("[PAD]", "<pad>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
}
#: the UTF-8 bytes that separate words: space, tab, newline, carriage return, \v and \f.
WHITESPACE_BYTES = (9, 10, 11, 12, 13, 32)
#: the first characters of a subword piece that starts a word: sentencepiece's ▁, and
#: byte-level BPE's space, newline and tab (Ġ, Ċ, ĉ).
WORD_START_MARKS = ("▁", "Ġ", "Ċ", "ĉ")
#: the prefix of a WordPiece piece that continues a word.
WORDPIECE_CONTINUATION = "##"


@dataclass(frozen=True)
class MLMVocab:
    """Ids of a masked language model: ``[0, vocab_size)``, the tokenizer's and the specials.

    Attributes:
        vocab_size: number of ids the model embeds.
        pad_id, cls_id, sep_id, mask_id: the special tokens.
        ordinary_ids: ``(V_o,)`` the ids a random replacement draws from (all but the
            specials).
        word_start: ``(vocab_size,)`` bool, whether each id starts a word (subword
            tokenizers); None for bytes (decided from whitespace in context) or when the
            tokenizer marks no word starts.
        bytes_level: the ordinary ids are UTF-8 bytes.
    """

    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    ordinary_ids: Tensor
    word_start: Tensor | None = None
    bytes_level: bool = False

    @property
    def special_ids(self) -> tuple[int, int, int, int]:
        """[PAD], [CLS], [SEP], [MASK]."""
        return self.pad_id, self.cls_id, self.sep_id, self.mask_id

    @property
    def knows_words(self) -> bool:
        """Whether word boundaries are known (whole-word masking is possible)."""
        return self.bytes_level or self.word_start is not None

    def is_special(self, tokens: Tensor) -> Tensor:
        """``(…)`` bool: which of ``tokens`` are special (padding included)."""
        specials = torch.tensor(self.special_ids, device=tokens.device)
        return torch.isin(tokens, specials)

    def require_words(self) -> None:
        """ValueError unless the tokenizer marks word boundaries (whole-word masking)."""
        if not self.knows_words:
            raise ValueError(
                "this tokenizer marks no word starts (no ▁ or Ġ prefixes, no ## continuations): "
                "whole-word masking needs them; use token-level masking (whole_word=False)"
            )

    def word_starts(self, tokens: Tensor) -> Tensor:
        """``(B, L)`` bool: which tokens of ``tokens (B, L)`` begin a new word; a special token
        and the token after it always do.

        Raises:
            ValueError: the tokenizer marks no word boundaries.
        """
        ordinary = ~self.is_special(tokens)
        if self.bytes_level:
            ws = torch.tensor(WHITESPACE_BYTES, device=tokens.device)
            in_word = ordinary & ~torch.isin(tokens, ws)
            continues = in_word.clone()
        else:
            self.require_words()
            assert self.word_start is not None
            in_word = ordinary
            continues = ordinary & ~self.word_start.to(tokens.device)[tokens.long()]
        continues[:, 1:] &= in_word[:, :-1]
        continues[:, 0] = False
        return ~continues

    def describe(self) -> dict[str, Any]:
        """The ids a run records (``mlm_vocab.json``)."""
        return {
            "vocab_size": self.vocab_size,
            **{f"{name}_id": getattr(self, f"{name}_id") for name in SPECIAL_NAMES},
            "ordinary_ids": len(self.ordinary_ids),
            "word_boundaries": "whitespace bytes"
            if self.bytes_level
            else ("word-start pieces" if self.word_start is not None else "unknown"),
        }


def mlm_vocab(tokenizer: Tokenizer) -> MLMVocab:
    """The MLM vocabulary of ``tokenizer``: its own special tokens where it has them, the
    others appended after its ids (bytes: [PAD] 256, [CLS] 257, [SEP] 258, [MASK] 259)."""
    size = tokenizer.vocab_size
    ids: dict[str, int] = {}
    for name in SPECIAL_NAMES:
        own = [tokenizer.token_to_id(s) for s in SPECIAL_SPELLINGS[name]]
        found = [i for i in own if i is not None and 0 <= i < tokenizer.vocab_size]
        if found:
            ids[name] = found[0]
        else:
            ids[name] = size
            size += 1
    special = set(ids.values())
    ordinary = torch.tensor([i for i in range(tokenizer.vocab_size) if i not in special])
    word_start = None
    if not tokenizer.bytes_level:
        pieces = [tokenizer.id_to_token(i) or "" for i in range(tokenizer.vocab_size)]
        word_start = _word_start_table(pieces, size, special)
    return MLMVocab(
        size,
        ids["pad"],
        ids["cls"],
        ids["sep"],
        ids["mask"],
        ordinary,
        word_start,
        tokenizer.bytes_level,
    )


def _word_start_table(pieces: list[str], size: int, special: set[int]) -> Tensor | None:
    """``(size,)`` bool: which ids start a word, from the ``pieces`` of the tokenizer's ids
    (the specials and the ids appended after them always do); None when no piece carries a
    marker. A vocabulary is read as WordPiece when more of its pieces carry ``##`` than a
    word-start mark: a byte-level BPE learnt on code has ``##`` pieces of its own (comment
    rules), a WordPiece vocabulary hardly any ``▁`` or ``Ġ``."""
    pieces = [p if i not in special else "" for i, p in enumerate(pieces)]
    continued = sum(p.startswith(WORDPIECE_CONTINUATION) for p in pieces)
    marked = sum(p.startswith(WORD_START_MARKS) for p in pieces)
    if not (continued or marked):
        return None
    if continued > marked:
        starts = [not p.startswith(WORDPIECE_CONTINUATION) for p in pieces]
    else:
        starts = [p.startswith(WORD_START_MARKS) for p in pieces]
    table = torch.ones(size, dtype=torch.bool)
    table[: len(pieces)] = torch.tensor(starts, dtype=torch.bool)
    table[sorted(special)] = True
    return table
