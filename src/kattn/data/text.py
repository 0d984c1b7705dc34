"""LRA Text: sentiment of IMDB reviews read as UTF-8 bytes, from the ``aclImdb`` release.

LRA takes the TFDS ``imdb_reviews`` splits (25,000 train, 25,000 test, labels neg 0 / pos 1)
and encodes each review with tfds ``ByteTextEncoder``: id = UTF-8 byte + 1, 0 = padding,
vocabulary 257. It has no validation split: the test split is used as validation *and* as
test (implementation notes §D.1–D.2). The length a review is cut to differs between codebases:

===========================  ===========  ======================================
codebase                     ``max_len``  padded to
===========================  ===========  ======================================
LRA official config          1000         1000 (the paper's text says up to 4K)
Nyströmformer                1000         1024
Skyformer (kattn's default)  4000         4096
===========================  ===========  ======================================

kattn pads to ``max_len`` itself; pad further (e.g. to 4096) in the model or the collate step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from ..checks import positive_int
from .base import DataFormatError, SequenceDataset, TaskData
from .text_examples import hold_out

#: ids are UTF-8 bytes + 1, and 0 is padding.
BYTE_VOCAB_SIZE = 257

#: the review files of ``aclImdb/{train,test}/{neg,pos}/``: ``<id>_<rating>.txt``.
_REVIEW_NAME = re.compile(r"(\d+)_(\d+)\.txt")
_LABELS = (("neg", 0), ("pos", 1))


def pad_bytes(docs: Sequence[bytes], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte-level ids of ``docs``: ``(N, max_len)`` int64, id = byte + 1, padded with 0 (longer
    documents cut), and the ``(N,)`` lengths.

    The same result as ``pad_sequences([[b + 1 for b in d] for d in docs], max_len)``, without a
    Python list per document (Retrieval holds about 330,000 documents of up to 4000 bytes).
    """
    tokens = np.zeros((len(docs), max_len), dtype=np.int16)
    lengths = np.zeros(len(docs), dtype=np.int64)
    for i, doc in enumerate(docs):
        doc = doc[:max_len]
        np.add(np.frombuffer(doc, dtype=np.uint8), 1, out=tokens[i, : len(doc)], dtype=np.int16)
        lengths[i] = len(doc)
    return torch.from_numpy(tokens), torch.from_numpy(lengths)


def load_text(
    data_dir: str | PathLike[str],
    *,
    max_len: int = 4000,
    valid: str | float = "test",
    seed: int = 0,
) -> TaskData:
    """Load LRA Text from the IMDB release (``aclImdb_v1.tar.gz`` unpacked).

    Reads ``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` in order of review id, negatives
    first; ``unsup/`` and every other file are not read (their count is in ``info``). Each review
    is stripped of surrounding ASCII whitespace (as TFDS does), checked to be UTF-8, encoded as
    byte + 1 and cut to ``max_len`` bytes; ``info["truncated"]`` counts the cut reviews per split.

    Args:
        data_dir: the ``aclImdb`` folder or the folder holding it.
        max_len: L, the length reviews are cut and padded to (see the module's table: LRA
            official 1000, Skyformer 4000).
        valid: ``"test"`` (LRA: the validation split *is* the test split, the same object), or
            a fraction in (0, 1) of the train split held out at random (``seed``) instead.
        seed: seeds the held-out part when ``valid`` is a fraction.

    Returns:
        The task's splits: tokens ``(N, max_len)``, vocabulary 257, 2 classes (neg 0, pos 1).

    Raises:
        DataFormatError: the folder, a split folder or its reviews are missing, or a review is
            not UTF-8; the message names the path.
        ValueError: ``max_len`` or ``valid`` is out of range.
    """
    positive_int("max_len", max_len)
    fraction = _check_valid(valid)
    root = _find_imdb(Path(data_dir))
    ignored = 0
    splits: dict[str, SequenceDataset] = {}
    cut: dict[str, torch.Tensor] = {}  # (N,) bool: the review was longer than max_len
    for split in ("train", "test"):
        docs, labels, skipped = _read_split(root / split)
        ignored += skipped
        splits[split] = _dataset(docs, labels, max_len)
        cut[split] = torch.tensor([len(doc) > max_len for doc in docs], dtype=torch.bool)

    info: dict[str, object] = {
        "source": str(root),
        "tokenisation": "UTF-8 bytes of each stripped review, id = byte + 1, 0 = padding",
        "ignored_files": ignored,
    }
    train, test = splits["train"], splits["test"]
    if fraction is None:
        valid_set = test
        info["valid"] = "the test split (LRA: validation = test)"
    else:
        train_idx, valid_idx = (torch.tensor(i) for i in hold_out(len(train), fraction, seed))
        train, valid_set = _subset(train, train_idx), _subset(train, valid_idx)
        cut["train"], cut["valid"] = cut["train"][train_idx], cut["train"][valid_idx]
        info["valid"] = f"{len(valid_set)} train reviews held out at random (seed {seed})"
    info["truncated"] = {split: int(flags.sum()) for split, flags in cut.items()}
    return TaskData(
        task="text",
        train=train,
        valid=valid_set,
        test=test,
        vocab_size=BYTE_VOCAB_SIZE,
        num_classes=2,
        max_len=max_len,
        info=info,
    )


def _check_valid(valid: str | float) -> float | None:
    if valid == "test":
        return None
    if isinstance(valid, (int, float)) and not isinstance(valid, bool) and 0 < valid < 1:
        return float(valid)
    raise ValueError(
        f"valid must be 'test' (LRA: validate on the test split) or a fraction in (0, 1) of "
        f"the train split to hold out, got {valid!r}"
    )


def _find_imdb(data_dir: Path) -> Path:
    candidates = (data_dir, data_dir / "aclImdb")
    for root in candidates:
        if (root / "train").is_dir() and (root / "test").is_dir():
            return root
    looked = " and ".join(str(c) for c in candidates)
    raise DataFormatError(
        f"no IMDB release found: looked for train/ and test/ folders in {looked}; expected the "
        f"unpacked aclImdb_v1.tar.gz (aclImdb/{{train,test}}/{{neg,pos}}/<id>_<rating>.txt)"
    )


def _read_split(split_dir: Path) -> tuple[list[bytes], list[int], int]:
    """The reviews of ``split_dir/{neg,pos}`` in order of id, their labels and how many other
    files those folders hold."""
    docs: list[bytes] = []
    labels: list[int] = []
    ignored = 0
    for name, label in _LABELS:
        folder = split_dir / name
        if not folder.is_dir():
            raise DataFormatError(
                f"{folder} is missing: expected a folder of <id>_<rating>.txt reviews there"
            )
        reviews = []
        for path in folder.iterdir():
            match = _REVIEW_NAME.fullmatch(path.name)
            if match and path.is_file():
                reviews.append(((int(match[1]), int(match[2])), path))
            else:
                ignored += 1
        if not reviews:
            raise DataFormatError(f"{folder} holds no <id>_<rating>.txt reviews")
        for _, path in sorted(reviews):
            raw = path.read_bytes().strip()
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"{path} is not UTF-8 text ({err})") from None
            docs.append(raw)
            labels.append(label)
    return docs, labels, ignored


def _dataset(docs: Sequence[bytes], labels: Sequence[int], max_len: int) -> SequenceDataset:
    tokens, lengths = pad_bytes(docs, max_len)
    return SequenceDataset(tokens, lengths, torch.tensor(labels, dtype=torch.int64))


def _subset(data: SequenceDataset, index: torch.Tensor) -> SequenceDataset:
    return SequenceDataset(data.tokens[index], data.lengths[index], data.labels[index])
