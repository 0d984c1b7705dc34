"""Labelled texts (single sentences or pairs) and their encoding as BERT inputs.

The text-classification loaders (:mod:`kattn.data.glue`, :mod:`kattn.data.agnews`) return
:class:`TextExamples`; :func:`encode_examples` turns them into a
:class:`~kattn.data.base.SequenceDataset` of ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``
ids (Devlin et al. 2019, §3), padded to one length by :func:`rows_dataset` (which pads the
rows of a Hugging Face tokenizer too). :func:`hold_out` draws the seeded
validation part of a training set (GLUE and AG News have no labelled set of their own for
choosing a checkpoint: their dev/test set is what is reported).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import SequenceDataset


@dataclass
class TextExamples:
    """Labelled examples of a text-classification (or regression) task.

    Attributes:
        texts: the first (or only) text of each example.
        labels: class ids ``0 … C−1``, or real targets of a regression task (STS-B).
        pairs: the second text of each example (sentence-pair tasks), else None.
        source: the file read (for messages and ``info``).
    """

    texts: list[str]
    labels: list[int] | list[float]
    pairs: list[str] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.labels)} labels for {len(self.texts)} texts")
        if self.pairs is not None and len(self.pairs) != len(self.texts):
            raise ValueError(f"{len(self.pairs)} second texts for {len(self.texts)} texts")

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: Sequence[int]) -> TextExamples:
        """The examples at ``index``, in that order."""
        return TextExamples(
            [self.texts[i] for i in index],
            [self.labels[i] for i in index],
            None if self.pairs is None else [self.pairs[i] for i in index],
            self.source,
        )


@dataclass(frozen=True)
class SpecialIds:
    """The ids of BERT's special tokens in a model's vocabulary."""

    pad: int
    cls: int
    sep: int


def hold_out(n: int, fraction: float, seed: int, cap: int | None = None) -> tuple[list, list]:
    """Indices of the kept and the held-out part of ``n`` examples (each in file order): a
    seeded random ``fraction`` of them (at most ``cap``).

    Raises:
        ValueError: the hold-out would leave one part empty.
    """
    count = round(n * fraction)
    if cap is not None:
        count = min(count, cap)
    if not 0 < count < n:
        raise ValueError(
            f"{fraction} of {n} training examples holds out {count}, which leaves a part "
            f"empty: a run needs at least one example to train on and one to validate on"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return sorted(perm[count:].tolist()), sorted(perm[:count].tolist())


def encode_examples(
    examples: TextExamples,
    encode: Callable[[str], list[int]],
    special: SpecialIds,
    max_len: int,
) -> tuple[SequenceDataset, int]:
    """``examples`` as ``[CLS] a [SEP]`` (``[CLS] a [SEP] b [SEP]`` for pairs) id rows padded
    with ``special.pad`` to ``max_len``; and how many were cut.

    A pair too long for ``max_len`` loses tokens from the end of its longer text, one at a
    time (BERT's ``_truncate_seq_pair``), so both texts keep as much as they can; a single text
    is cut at its end. Labels are int64 class ids, or float32 regression targets.
    """
    rows: list[list[int]] = []
    cut = 0
    room = max_len - (2 if examples.pairs is None else 3)
    if room < 2:
        raise ValueError(f"max_len must leave room for the special tokens and text, got {max_len}")
    for i, text in enumerate(examples.texts):
        first = encode(text)
        if examples.pairs is None:
            cut += len(first) > room
            rows.append([special.cls, *first[:room], special.sep])
            continue
        second = encode(examples.pairs[i])
        cut += len(first) + len(second) > room
        while len(first) + len(second) > room:
            (first if len(first) > len(second) else second).pop()
        rows.append([special.cls, *first, special.sep, *second, special.sep])
    return rows_dataset(rows, examples.labels, special.pad, max_len), cut


def padded(rows: Sequence[Sequence[int]], fill: int, max_len: int, dtype: torch.dtype) -> Tensor:
    """``rows`` (each at most ``max_len`` long) as an ``(N, max_len)`` tensor of ``dtype``,
    each row followed by ``fill``."""
    out = torch.full((len(rows), max_len), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def rows_dataset(
    rows: Sequence[Sequence[int]],
    labels: Sequence[int] | Sequence[float],
    pad: int,
    max_len: int,
    dtype: torch.dtype | None = None,
) -> SequenceDataset:
    """The dataset of id ``rows`` padded with ``pad`` to ``max_len``, their lengths and
    ``labels``: int64 class ids, or float32 regression targets where one is a float.

    ``dtype`` is that of the tokens; by default int16 where every id fits, else int32.
    """
    if dtype is None:
        largest = max([pad, *(max(row) for row in rows if row)])
        dtype = torch.int16 if largest < 2**15 else torch.int32
    tokens = padded(rows, pad, max_len, dtype)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.int64)
    regression = any(isinstance(label, float) for label in labels)
    targets = torch.tensor(labels, dtype=torch.float32 if regression else torch.int64)
    return SequenceDataset(tokens, lengths, targets)
