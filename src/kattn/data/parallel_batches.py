"""Subword ids and batches of the translation task: a joint BPE vocabulary over both languages
and batches packed to a token budget (``max_tokens``), as fairseq trains IWSLT'14 De–En (the
setting Luo et al., 2021, §4.3 follow: a joint BPE of 10K codes).

Ids: ``<pad>`` 0 (kattn's padding id), ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3. A source row is
``src + <eos>``; the decoder reads ``<bos> + tgt`` (``tgt_in``) and predicts ``tgt + <eos>``
(``tgt_out``), so a pair takes ``max(len(src), len(tgt)) + 1`` columns.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .base import PAD_ID
from .tokenizers import _require

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
BOS_ID, EOS_ID, UNK_ID = 1, 2, 3
#: the joint BPE vocabulary size of the paper's IWSLT'14 setting.
TRANSLATION_VOCAB_SIZE = 10_000


class JointBPE:
    """A byte-level BPE shared by source and target (HuggingFace ``tokenizers``): text is NFC
    normalised, split at spaces and punctuation into UTF-8 bytes, then merged; decoding gives
    the NFC text back exactly (``<unk>`` never occurs: every byte is in the vocabulary).

    Attributes:
        vocab_size: ids are in ``[0, vocab_size)``; the four :data:`SPECIAL_TOKENS` first.
        path: the JSON file it was read from or saved to, or None.
    """

    def __init__(self, tokenizer: Any, path: Path | None = None) -> None:
        self._tokenizer = tokenizer
        self.path = path
        for expected, token in enumerate(SPECIAL_TOKENS):
            found = self._tokenizer.token_to_id(token)
            if found != expected:
                raise ValueError(
                    f"{path or 'the tokenizer'}: {token} has id {found}, expected {expected} "
                    f"(a translation vocabulary starts with {', '.join(SPECIAL_TOKENS)})"
                )
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = TRANSLATION_VOCAB_SIZE) -> JointBPE:
        """Learn merges on ``texts`` (both sides of the training pairs) up to ``vocab_size``
        ids, the special tokens and the 256 bytes included."""
        tk = _require("tokenizers", "a joint BPE vocabulary")
        from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

        if vocab_size < len(SPECIAL_TOKENS) + 256:
            raise ValueError(
                f"vocab_size must hold the {len(SPECIAL_TOKENS)} special tokens and 256 bytes, "
                f"got {vocab_size}"
            )
        tokenizer = tk.Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def from_file(cls, path: str | Path) -> JointBPE:
        """A vocabulary saved by :meth:`save` (or any ``tokenizers`` JSON whose first ids are
        the :data:`SPECIAL_TOKENS`)."""
        tk = _require("tokenizers", "a joint BPE vocabulary")
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer file at {file}")
        return cls(tk.Tokenizer.from_file(str(file)), file)

    def save(self, path: str | Path) -> Path:
        self.path = Path(path)
        self._tokenizer.save(str(self.path))
        return self.path

    def encode(self, text: str) -> list[int]:
        """The subword ids of ``text`` (no ``<bos>``/``<eos>``)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``, special tokens (padding, ``<bos>``, ``<eos>``) left out."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        values = [i for i in values if i >= len(SPECIAL_TOKENS) or i == UNK_ID]
        return str(self._tokenizer.decode(values, skip_special_tokens=False))


@dataclass
class ParallelBatch:
    """A padded batch of B sentence pairs (True in a mask marks padding).

    Attributes:
        indices: ``(B,)`` the pairs' positions in the encoded split.
        src: ``(B, Ls)`` ``src + <eos>``, padded with 0; src_padding ``(B, Ls)``.
        tgt_in: ``(B, Lt)`` ``<bos> + tgt``; tgt_out ``(B, Lt)`` ``tgt + <eos>``; both padded
            with 0; tgt_padding ``(B, Lt)``.
    """

    indices: Tensor
    src: Tensor
    src_padding: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_padding: Tensor

    def num_tokens(self) -> int:
        """The padded size fairseq counts against ``max_tokens``: B · max(Ls, Lt)."""
        return int(self.src.shape[0] * max(self.src.shape[1], self.tgt_in.shape[1]))


@dataclass
class TokenBatches:
    """An epoch's batches of pair indices.

    Attributes:
        batches: index lists; together they hold every kept pair exactly once.
        skipped: the pairs longer than ``max_tokens`` left out (``too_long="skip"``).
    """

    batches: list[list[int]]
    skipped: list[int]


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    too_long: str = "raise",
) -> TokenBatches:
    """Pairs packed so that each batch's ``B · max(len_src + 1, len_tgt + 1) ≤ max_tokens``
    (the columns of :func:`collate_pairs`, padding counted, as fairseq does).

    Pairs are sorted by their width (then source length), ties in a random order; runs of the
    sorted order are cut greedily into batches, and the batches are shuffled. Both random
    orders come from ``(seed, epoch)`` only: the same arguments give the same batches.

    Args:
        too_long: a pair whose width exceeds ``max_tokens`` raises (``"raise"``) or is left out
            and listed in ``skipped`` (``"skip"``).
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target ones")
    if max_tokens < 1 or too_long not in ("raise", "skip"):
        raise ValueError(
            f"need max_tokens ≥ 1 and too_long 'raise' or 'skip': {max_tokens}, {too_long!r}"
        )
    rng = random.Random(f"{seed}:{epoch}")
    width = [max(s, t) + 1 for s, t in zip(src_lengths, tgt_lengths, strict=True)]
    skipped = [i for i, w in enumerate(width) if w > max_tokens]
    if skipped and too_long == "raise":
        i = skipped[0]
        raise ValueError(
            f"pair {i} takes {width[i]} columns (source {src_lengths[i]}, target "
            f"{tgt_lengths[i]} tokens + <eos>/<bos>) > max_tokens={max_tokens} "
            f"({len(skipped)} such pairs): raise max_tokens or pass too_long='skip'"
        )
    ties = list(range(len(width)))
    rng.shuffle(ties)
    rank = {i: r for r, i in enumerate(ties)}
    order = sorted(
        (i for i, w in enumerate(width) if w <= max_tokens),
        key=lambda i: (width[i], src_lengths[i], rank[i]),
    )
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in order:  # widths only grow along the order: the newest pair sets the batch width
        if batch and width[i] * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    rng.shuffle(batches)
    return TokenBatches(batches, skipped)


def collate_pairs(
    src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], indices: Sequence[int]
) -> ParallelBatch:
    """The padded batch of pairs ``indices`` of the encoded ``src_ids``/``tgt_ids``."""
    src = [[*src_ids[i], EOS_ID] for i in indices]
    tgt_in = [[BOS_ID, *tgt_ids[i]] for i in indices]
    tgt_out = [[*tgt_ids[i], EOS_ID] for i in indices]
    src_t, src_pad = _pad(src)
    tgt_in_t, tgt_pad = _pad(tgt_in)
    tgt_out_t, _ = _pad(tgt_out)
    index = torch.as_tensor(list(indices), dtype=torch.int64)
    return ParallelBatch(index, src_t, src_pad, tgt_in_t, tgt_out_t, tgt_pad)


def iterate_batches(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    too_long: str = "raise",
) -> Iterator[ParallelBatch]:
    """One epoch of padded batches of the encoded pairs (:func:`token_batches`, then
    :func:`collate_pairs`)."""
    plan = token_batches(
        [len(s) for s in src_ids],
        [len(t) for t in tgt_ids],
        max_tokens,
        seed=seed,
        epoch=epoch,
        too_long=too_long,
    )
    for indices in plan.batches:
        yield collate_pairs(src_ids, tgt_ids, indices)


def _pad(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.int64)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    padding = torch.arange(width)[None, :] >= torch.as_tensor([len(r) for r in rows])[:, None]
    return ids, padding
