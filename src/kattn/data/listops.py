"""LRA ListOps: the value (0–9) of a nested list expression of MIN, MAX, MED and SM.

An expression such as ``[MAX 2 [MIN 4 7 ] 0 ]`` is released fully parenthesised, one pair per
argument, ``( ( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )``, in
``lra_release/listops-1000/basic_{train,val,test}.tsv`` (96,000 / 2,000 / 2,000 examples): a
header ``Source<TAB>Target`` then one ``source<TAB>label`` row per expression (implementation
notes §D.1). ``generate_listops`` re-implements LRA's generator (§D.3) and ``write_listops``
writes its output in that format; both are in :mod:`kattn.data.listops_generator` and are
re-exported here.

Two tokenisations are in use (§D.2, §A.7). Both give ``( ( ( [MAX 2 ) 9 ) ] )`` as:

* ``"official"`` — LRA's pipeline since March 2021 (and S4): ``]`` → ``X``, ``(`` and ``)``
  deleted, split on whitespace: ``[MAX 2 9 X``.
* ``"legacy"`` — LRA's first pipeline, used verbatim by Nyströmformer and Skyformer: tfds
  ``Tokenizer()`` keeps alphanumeric runs only, so every bracket is dropped: ``MAX 2 9``. This
  loses the tree: without ``]`` an expression's extent is ambiguous (``MAX 2 MIN 4 7 0`` may be
  ``[MAX 2 [MIN 4 7 ] 0 ]`` or ``[MAX 2 [MIN 4 7 0 ] ]``), which LRA's maintainers called a bug
  (LRA issues #6 and #14). Use it only to reproduce those papers' numbers.

LRA numbers tokens in the order of a Python ``set`` (1..15, OOV 16), which is arbitrary; kattn
fixes the ids instead, the same for both tokenisations, so a checkpoint means the same thing
whatever data it was trained on:

========  ==========================  ==========================
id        official token              legacy token
========  ==========================  ==========================
0         padding                     padding
1–4       ``[MIN [MAX [MED [SM``      ``MIN MAX MED SM``
5         ``X`` (a closing ``]``)     (never produced)
6–15      ``0`` … ``9``               ``0`` … ``9``
16        any other token (OOV)       any other token (OOV)
========  ==========================  ==========================
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from os import PathLike
from pathlib import Path

import torch

from ..checks import positive_int
from .base import DataFormatError, SequenceDataset, TaskData, pad_sequences
from .listops_generator import (
    _DIGITS,
    _HEADER,
    END,
    LISTOPS_FILES,
    OPERATORS,
    VALUE_P,
    Tree,
    generate_listops,
    generate_tree,
    to_string,
    tree_value,
    write_listops,
)

__all__ = [
    "END",
    "LISTOPS_FILES",
    "LISTOPS_LEGACY_VOCAB",
    "LISTOPS_OOV_ID",
    "LISTOPS_VOCAB",
    "LISTOPS_VOCAB_SIZE",
    "OPERATORS",
    "VALUE_P",
    "Tree",
    "encode_listops",
    "generate_listops",
    "generate_tree",
    "load_listops",
    "to_string",
    "tokenize_listops",
    "tree_value",
    "write_listops",
]

_DIGIT_IDS = {str(d): 6 + d for d in _DIGITS}
#: token → id of the official tokenisation (see the module's table).
LISTOPS_VOCAB: dict[str, int] = {"[MIN": 1, "[MAX": 2, "[MED": 3, "[SM": 4, "X": 5, **_DIGIT_IDS}
#: token → id of the legacy tokenisation: the operators keep their official ids, 5 is unused.
LISTOPS_LEGACY_VOCAB: dict[str, int] = {"MIN": 1, "MAX": 2, "MED": 3, "SM": 4, **_DIGIT_IDS}
#: the id of every token outside the vocabulary.
LISTOPS_OOV_ID = 16
LISTOPS_VOCAB_SIZE = 17

_OFFICIAL_TABLE = str.maketrans({"]": "X", "(": None, ")": None})
_NON_ALNUM = re.compile(r"\W+")  # tfds Tokenizer(alphanum_only=True) splits on this
_TARGET = re.compile(r"[0-9]")


def _official_tokens(source: str) -> list[str]:
    return source.translate(_OFFICIAL_TABLE).split()


def _legacy_tokens(source: str) -> list[str]:
    return [token for token in _NON_ALNUM.split(source) if token]


_TOKENISATIONS: dict[str, tuple[Callable[[str], list[str]], dict[str, int], str]] = {
    "official": (
        _official_tokens,
        LISTOPS_VOCAB,
        "official (LRA since 2021): ']' -> 'X', '(' and ')' deleted, split on whitespace",
    ),
    "legacy": (
        _legacy_tokens,
        LISTOPS_LEGACY_VOCAB,
        "legacy (LRA's first pipeline, Nyströmformer, Skyformer): alphanumeric runs only, "
        "every bracket dropped, the tree structure lost",
    ),
}


def tokenize_listops(source: str, tokenization: str = "official") -> list[str]:
    """The tokens of a released source under ``tokenization`` (``"official"`` or
    ``"legacy"``; see the module's table)."""
    return _tokenisation(tokenization)[0](source)


def encode_listops(source: str, tokenization: str = "official") -> list[int]:
    """The ids of a released source: :func:`tokenize_listops` then the fixed vocabulary, with
    ``LISTOPS_OOV_ID`` for unknown tokens."""
    tokenize, vocab, _ = _tokenisation(tokenization)
    return [vocab.get(token, LISTOPS_OOV_ID) for token in tokenize(source)]


def load_listops(
    data_dir: str | PathLike[str], *, tokenization: str = "official", max_len: int = 2000
) -> TaskData:
    """Load LRA ListOps from the released (or :func:`write_listops`'s) TSV files.

    Args:
        data_dir: the folder holding ``basic_{train,val,test}.tsv`` (the released
            ``listops-1000``), or the ``lra_release`` root holding that folder.
        tokenization: ``"official"`` (LRA's current pipeline, brackets kept) or ``"legacy"``
            (Nyströmformer/Skyformer, brackets dropped); see the module's table.
        max_len: L, the length sequences are cut and padded to (LRA: 2000; released sources
            have at most 1999 tokens).

    Returns:
        The splits: tokens ``(N, max_len)`` with the fixed ids of the module's table,
        vocabulary 17, 10 classes. ``info`` holds the tokenisation, the vocabulary, and per
        split the number of examples, of sequences cut to ``max_len`` (``"truncated"``) and
        of out-of-vocabulary tokens (``"oov_tokens"``, also warned about).

    A UTF-8 byte-order mark before the header and empty lines at the end of a file are read
    (an editor or a spreadsheet export may add them).

    Raises:
        DataFormatError: a file is missing (the message says which and where), or a line is
            malformed: header not ``Source<TAB>Target``, not 2 tab-separated columns, a label
            not an int in 0–9, a source without tokens, or an empty line between rows (the
            message names file and line).
        ValueError: ``tokenization`` or ``max_len`` is not valid.
    """
    tokenize, vocab, description = _tokenisation(tokenization)
    positive_int("max_len", max_len)
    folder = _find_folder(Path(data_dir))
    splits: dict[str, SequenceDataset] = {}
    counts: dict[str, dict[str, int]] = {"examples": {}, "truncated": {}, "oov_tokens": {}}
    unknown: set[str] = set()
    for split, name in LISTOPS_FILES.items():
        sources, labels = _read_tsv(folder / name)
        sequences, cut, oov = [], 0, 0
        for source in sources:
            tokens = tokenize(source)
            cut += len(tokens) > max_len
            ids = [vocab.get(token, LISTOPS_OOV_ID) for token in tokens[:max_len]]
            if LISTOPS_OOV_ID in ids:
                oov += ids.count(LISTOPS_OOV_ID)
                unknown.update(t for t in tokens[:max_len] if t not in vocab)
            sequences.append(ids)
        tokens_t, lengths = pad_sequences(sequences, max_len)
        splits[split] = SequenceDataset(tokens_t, lengths, torch.tensor(labels, dtype=torch.int64))
        counts["examples"][split] = len(sources)
        counts["truncated"][split] = cut
        counts["oov_tokens"][split] = oov
    if unknown:
        shown = ", ".join(repr(t) for t in sorted(unknown)[:10])
        warnings.warn(
            f"ListOps in {folder}: {sum(counts['oov_tokens'].values())} tokens outside the "
            f"{tokenization} vocabulary (e.g. {shown}) were given the OOV id {LISTOPS_OOV_ID}",
            stacklevel=2,
        )
    return TaskData(
        task="listops",
        train=splits["train"],
        valid=splits["valid"],
        test=splits["test"],
        vocab_size=LISTOPS_VOCAB_SIZE,
        num_classes=10,
        max_len=max_len,
        info={
            "source": str(folder),
            "files": dict(LISTOPS_FILES),
            "tokenisation": description,
            "vocabulary": dict(vocab),
            **counts,
            "unknown_tokens": sorted(unknown),
        },
    )


def _tokenisation(name: str) -> tuple[Callable[[str], list[str]], dict[str, int], str]:
    if name not in _TOKENISATIONS:
        raise ValueError(f"tokenization must be one of {sorted(_TOKENISATIONS)}, got {name!r}")
    return _TOKENISATIONS[name]


def _find_folder(data_dir: Path) -> Path:
    candidates = (data_dir, data_dir / "listops-1000")
    for folder in candidates:
        if all((folder / name).is_file() for name in LISTOPS_FILES.values()):
            return folder
    looked = " and ".join(str(c) for c in candidates)
    for folder in candidates:
        present = [name for name in LISTOPS_FILES.values() if (folder / name).is_file()]
        if present:
            missing = sorted(set(LISTOPS_FILES.values()) - set(present))
            raise DataFormatError(
                f"{folder} lacks {', '.join(missing)}: expected the folder holding "
                f"{', '.join(LISTOPS_FILES.values())} (looked in {looked})"
            )
    raise DataFormatError(
        f"no ListOps files found: looked for {', '.join(LISTOPS_FILES.values())} in {looked}; "
        f"expected the released listops-1000 folder, the lra_release root holding it, or the "
        f"folder write_listops wrote"
    )


def _read_tsv(path: Path) -> tuple[list[str], list[int]]:
    """The sources and labels of one file, checked line by line."""
    sources: list[str] = []
    labels: list[int] = []
    blank = 0  # the first of the empty lines since the last row
    with path.open("rb") as file:
        for lineno, raw in enumerate(file, start=1):
            try:
                line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"{path}, line {lineno}: not UTF-8 text ({err})") from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark an editor may add
                if line != _HEADER:
                    raise DataFormatError(
                        f"{path}, line 1: header {line[:50]!r}, expected {_HEADER!r} "
                        f"(Source, a tab, Target)"
                    )
                continue
            if not line.strip():  # empty lines at the end (a newline too many) hold nothing
                blank = blank or lineno
                continue
            if blank:
                raise DataFormatError(
                    f"{path}, line {blank}: an empty line between rows, expected "
                    f"'source<TAB>label' (empty lines are read only at the end of the file)"
                )
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataFormatError(
                    f"{path}, line {lineno}: {len(fields)} tab-separated columns, expected 2 "
                    f"(the expression, a tab, its value 0-9)"
                )
            source, target = fields
            if not source.strip():
                raise DataFormatError(f"{path}, line {lineno}: the source (column 1) is empty")
            if not _TARGET.fullmatch(target.strip()):
                raise DataFormatError(
                    f"{path}, line {lineno}: target {target[:20]!r} is not an int in 0-9 (column 2)"
                )
            sources.append(source)
            labels.append(int(target))
    if not sources:
        raise DataFormatError(
            f"{path} holds no examples: expected the header {_HEADER!r} and one "
            f"'source<TAB>label' row per expression"
        )
    return sources, labels
