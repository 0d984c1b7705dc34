"""LRA Retrieval: do two ACL Anthology Network papers cite one another, read as bytes.

The released ``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (147,086 / 18,090 /
17,437 pairs) have no header and five tab-separated columns ``label id1 id2 text1 text2``;
``label`` is 0 or 1, written as a float by some files (``1.0``). LRA reads them with
``CsvDataset(..., use_quote_delim=False)``: quotes are ordinary characters of the texts. Each
text is encoded like Text (tfds ``ByteTextEncoder``: id = UTF-8 byte + 1, 0 = padding,
vocabulary 257) after LRA's ``s.numpy()[:10000]`` cut, then cut to ``max_len`` tokens
(implementation notes §D.1–D.2, §A.7: Skyformer 4000, padded to 4096).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import torch

from ..checks import positive_int
from .base import DataFormatError, SequenceDataset, TaskData
from .text import BYTE_VOCAB_SIZE, pad_bytes

#: split → released file name.
AAN_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "valid": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}

#: LRA cuts every text to this many bytes before encoding. ``s.numpy()`` of a ``tf.string`` is
#: ``bytes``, so the cut counts bytes (the notes say characters; the two agree on ASCII text
#: and give the same tokens whenever ``max_len`` <= 10,000).
MAX_DOC_BYTES = 10_000

_COLUMNS = "label, id1, id2, text1, text2"


def load_retrieval(data_dir: str | PathLike[str], *, max_len: int = 4000) -> TaskData:
    """Load LRA Retrieval (AAN) from the released TSV files.

    Args:
        data_dir: the folder holding ``new_aan_pairs.{train,eval,test}.tsv``, or the
            ``lra_release`` root holding them in ``tsv_data/``.
        max_len: L, the length each text is cut and padded to (after the 10,000-byte cut).

    Returns:
        Paired splits (``tokens``/``lengths`` from ``text1``, ``tokens2``/``lengths2`` from
        ``text2``, each ``(N, max_len)``), vocabulary 257, 2 classes. ``info["truncated"]``
        counts, per split, the texts (two per pair) cut to ``max_len``.

    Raises:
        DataFormatError: a file is missing (the message says where it looked), or a row does
            not have 5 columns or its label is not 0 or 1 (the message names file and line).
        ValueError: ``max_len`` is not a positive int.
    """
    positive_int("max_len", max_len)
    folder = _find_folder(Path(data_dir))
    splits: dict[str, SequenceDataset] = {}
    truncated: dict[str, int] = {}
    for split, name in AAN_FILES.items():
        docs1, docs2, labels, cut = _read_tsv(folder / name, max_len)
        tokens, lengths = pad_bytes(docs1, max_len)
        tokens2, lengths2 = pad_bytes(docs2, max_len)
        labels_t = torch.tensor(labels, dtype=torch.int64)
        splits[split] = SequenceDataset(tokens, lengths, labels_t, tokens2, lengths2)
        truncated[split] = cut
    return TaskData(
        task="retrieval",
        train=splits["train"],
        valid=splits["valid"],
        test=splits["test"],
        vocab_size=BYTE_VOCAB_SIZE,
        num_classes=2,
        max_len=max_len,
        info={
            "source": str(folder),
            "files": {split: name for split, name in AAN_FILES.items()},
            "tokenisation": (
                f"each text's first {MAX_DOC_BYTES} bytes, id = byte + 1, 0 = padding, "
                f"cut to {max_len}"
            ),
            "truncated": truncated,
        },
    )


def _find_folder(data_dir: Path) -> Path:
    candidates = (data_dir, data_dir / "tsv_data")
    for folder in candidates:
        if all((folder / name).is_file() for name in AAN_FILES.values()):
            return folder
    looked = " and ".join(str(c) for c in candidates)
    for folder in candidates:
        present = [name for name in AAN_FILES.values() if (folder / name).is_file()]
        if present:
            missing = sorted(set(AAN_FILES.values()) - set(present))
            raise DataFormatError(f"{folder} lacks {', '.join(missing)} (looked in {looked})")
    raise DataFormatError(
        f"no AAN files found: looked for {', '.join(AAN_FILES.values())} in {looked}; expected "
        f"the lra_release root (files in tsv_data/) or the folder holding them"
    )


def _read_tsv(path: Path, max_len: int) -> tuple[list[bytes], list[bytes], list[int], int]:
    """Texts 1 and 2 (cut to ``min(10,000, max_len)`` bytes), labels, and how many texts were
    longer than ``max_len`` after the 10,000-byte cut."""
    keep = min(MAX_DOC_BYTES, max_len)
    docs1: list[bytes] = []
    docs2: list[bytes] = []
    labels: list[int] = []
    cut = blank = 0
    # binary, split on "\n" only: no quote handling, and a "\r" inside a text stays a byte
    with path.open("rb") as file:
        for lineno, raw in enumerate(file, start=1):
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            if not line:  # empty lines at the end (a newline too many) hold no pair
                blank = blank or lineno
                continue
            if blank:
                raise DataFormatError(
                    f"{path}, line {blank}: 1 tab-separated columns, expected 5 ({_COLUMNS}); "
                    f"empty lines are read only at the end of the file"
                )
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise DataFormatError(
                    f"{path}, line {lineno}: {len(fields)} tab-separated columns, expected 5 "
                    f"({_COLUMNS}) with no header"
                )
            labels.append(_label(fields[0], path, lineno))
            for doc, docs in ((fields[3], docs1), (fields[4], docs2)):
                doc = doc[:MAX_DOC_BYTES]
                cut += len(doc) > max_len
                docs.append(doc[:keep])
    if not labels:
        raise DataFormatError(f"{path} is empty: expected one row ({_COLUMNS}) per pair")
    return docs1, docs2, labels, cut


def _label(field: bytes, path: Path, lineno: int) -> int:
    try:
        value = float(field)
    except ValueError:
        value = float("nan")
    if value not in (0.0, 1.0):
        raise DataFormatError(
            f"{path}, line {lineno}: label {field.decode(errors='replace')!r} is not 0 or 1 "
            f"(the first column; 1.0 and 0.0 are accepted)"
        )
    return int(value)
