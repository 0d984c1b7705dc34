"""Corpora of the language-modelling task: text read from files, split into train, valid and
test, and tokenised into compact 1-D id tensors.

Layouts read by :func:`load_corpus`:

* ``None`` — the embedded default: this Python's own standard-library sources (see
  :func:`stdlib_corpus`); nothing is downloaded and no third-party text is shipped.
* a text file — split contiguously 90/5/5 by bytes, at line boundaries (:func:`split_bytes`).
* a folder of ``.txt`` files — every one (recursively, sorted by relative path) concatenated in
  that order, a newline added after a file that lacks one, then split as a single file.
* the WikiText layout — a folder holding ``wiki.{train,valid,test}.tokens`` (or the ``.raw``
  variants): the three files are the three splits.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .base import DataFormatError
from .tokenizers import Tokenizer

#: the fractions of the train, valid and test splits of a corpus that has no splits of its own.
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
#: how many bytes of standard-library source the embedded corpus holds.
EMBEDDED_CORPUS_BYTES = 4_000_000
#: folders of the standard library the embedded corpus leaves out: installed packages, tests,
#: and ``encodings`` (mostly machine-generated codec tables, which would otherwise fill the
#: validation and test splits of the default budget).
STDLIB_EXCLUDED = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings"}
)
#: the WikiText file names per variant, in split order.
WIKITEXT_FILES = {
    variant: tuple(f"wiki.{split}.{variant}" for split in ("train", "valid", "test"))
    for variant in ("tokens", "raw")
}
#: how many file names ``info["files"]`` lists at most (``info["num_files"]`` counts them all).
LISTED_FILES = 100

SPLITS = ("train", "valid", "test")


@dataclass
class Corpus:
    """The UTF-8 bytes of the three splits of a corpus.

    Attributes:
        train, valid, test: the splits' bytes.
        info: the layout, the files read, bytes per split and a SHA-256 of the corpus.
    """

    train: bytes
    valid: bytes
    test: bytes
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class LMData:
    """A corpus tokenised: one 1-D id tensor per split (uint8 for bytes, else int32).

    Attributes:
        train, valid, test: ``(N,)`` ids of each split.
        vocab_size: ids are in ``[0, vocab_size)``.
        tokenizer: what made the ids.
        num_bytes: the UTF-8 bytes of each split's text (the denominator of bits per byte).
        info: the corpus's info and the tokenisation.
    """

    train: Tensor
    valid: Tensor
    test: Tensor
    vocab_size: int
    tokenizer: Tokenizer
    num_bytes: dict[str, int]
    info: dict[str, Any] = field(default_factory=dict)
    task: str = "lm"

    def split(self, name: str) -> Tensor:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        tokens: Tensor = getattr(self, name)
        return tokens

    def bytes_per_token(self, name: str) -> float:
        """UTF-8 bytes per token of split ``name`` (1 for bytes)."""
        return self.num_bytes[name] / max(len(self.split(name)), 1)


def load_corpus(path: str | Path | None = None, *, max_bytes: int | None = None) -> Corpus:
    """The train, valid and test text of ``path`` (see the module docstring for the layouts).

    Args:
        path: a text file, a folder of ``.txt`` files, a WikiText folder, or None for the
            embedded standard-library corpus.
        max_bytes: the byte budget of the embedded corpus (default
            :data:`EMBEDDED_CORPUS_BYTES`); only with ``path=None``.

    Raises:
        DataFormatError: the path, a file of the layout, or its text is missing or empty; the
            message names the file and what was expected.
    """
    if path is None:
        return stdlib_corpus(max_bytes or EMBEDDED_CORPUS_BYTES)
    if max_bytes is not None:
        raise ValueError("max_bytes is the budget of the embedded corpus: give it with path=None")
    root = Path(path)
    if root.is_file():
        data = _read(root)
        return _split_corpus(data, {"layout": "file", "path": str(root), "files": [root.name]})
    if not root.is_dir():
        raise DataFormatError(
            f"{root} does not exist: expected a text file, a folder of .txt files or a "
            f"WikiText folder (wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens)"
        )
    for variant, wiki_names in WIKITEXT_FILES.items():
        if any((root / name).exists() for name in wiki_names):
            return _wikitext(root, variant, wiki_names)
    files = sorted(root.rglob("*.txt"), key=lambda p: p.relative_to(root).as_posix())
    files = [p for p in files if p.is_file()]
    if not files:
        raise DataFormatError(
            f"{root} holds no .txt files and no WikiText files (wiki.train.tokens, "
            f"wiki.valid.tokens, wiki.test.tokens or their .raw variants)"
        )
    data = _concatenate([_read(p) for p in files])
    names = [p.relative_to(root).as_posix() for p in files]
    return _split_corpus(data, {"layout": "folder", "path": str(root), **_listed(names)})


def stdlib_corpus(max_bytes: int = EMBEDDED_CORPUS_BYTES) -> Corpus:
    """The embedded corpus: the ``*.py`` files of this Python's standard library
    (``sysconfig.get_paths()["stdlib"]``) in sorted relative-path order, without installed
    packages and test folders (:data:`STDLIB_EXCLUDED`), concatenated up to ``max_bytes``
    (the last file cut after a newline), then split 90/5/5 as a single file.

    The same Python installation always gives the same bytes; ``info`` records its version,
    the path, the number of files and the SHA-256, so runs on different installations can be
    told apart.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[bytes] = []
    names: list[str] = []
    total = 0
    for file in stdlib_files(root):
        text = _concatenate([file.read_bytes()]) if file.stat().st_size else b""
        full = total + len(text) <= max_bytes
        if not full:  # the last file: cut after its last newline within the budget
            text = text[: text.rfind(b"\n", 0, max_bytes - total) + 1]
        if text:
            parts.append(text)
            names.append(file.relative_to(root).as_posix())
            total += len(text)
        if not full:
            break
    if not parts:
        raise DataFormatError(f"no standard-library sources (*.py) found under {root}")
    info: dict[str, Any] = {
        "layout": "stdlib",
        "path": str(root),
        "python_version": platform.python_version(),
        "budget_bytes": max_bytes,
        **_listed(names),
    }
    return _split_corpus(b"".join(parts), info)


def stdlib_files(root: str | Path) -> list[Path]:
    """The ``*.py`` files under ``root`` in sorted relative-path order, leaving out every
    folder named in :data:`STDLIB_EXCLUDED` (and ``__pycache__``)."""
    base = Path(root)
    skip = STDLIB_EXCLUDED | {"__pycache__"}
    found = [
        p
        for p in base.rglob("*.py")
        if p.is_file() and not skip.intersection(p.relative_to(base).parts[:-1])
    ]
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


def split_bytes(data: bytes, fractions: tuple[float, ...] = SPLIT_FRACTIONS) -> list[bytes]:
    """``data`` cut contiguously into parts of about ``fractions`` of its bytes, each cut just
    after the first newline at or past the target offset (at a UTF-8 character boundary when
    no newline follows).

    Raises:
        DataFormatError: a part would be empty (the text is too short for the fractions).
    """
    if not math.isclose(sum(fractions), 1.0):
        raise ValueError(f"split fractions must sum to 1, got {fractions}")
    cuts, start = [0], 0.0
    for fraction in fractions[:-1]:
        start += fraction
        cuts.append(max(_boundary(data, round(start * len(data))), cuts[-1]))
    cuts.append(len(data))
    parts = [data[a:b] for a, b in itertools.pairwise(cuts)]
    if not all(parts):
        lines = data.count(b"\n")
        raise DataFormatError(
            f"a text of {len(data)} bytes ({lines} lines) is too short to split "
            f"{'/'.join(f'{100 * f:g}' for f in fractions)} at line boundaries with no split "
            f"empty; give a longer text"
        )
    return parts


def tokenize_corpus(corpus: Corpus, tokenizer: Tokenizer) -> LMData:
    """The splits of ``corpus`` as ids of ``tokenizer``: uint8 tensors for bytes (no copy
    through Python lists), int32 otherwise.

    Raises:
        ValueError: the tokenizer gave an id outside its vocabulary.
    """
    ids: dict[str, Tensor] = {}
    for name in SPLITS:
        tokens = tokenizer.encode_array(getattr(corpus, name))
        if not tokenizer.bytes_level:
            tokens = tokens.to(torch.int32)
            if len(tokens) and (int(tokens.max()) >= tokenizer.vocab_size or tokens.min() < 0):
                raise ValueError(
                    f"{tokenizer.name} gave ids outside [0, {tokenizer.vocab_size}) on the "
                    f"{name} split"
                )
        ids[name] = tokens
    num_bytes = {name: len(getattr(corpus, name)) for name in SPLITS}
    info = {
        **corpus.info,
        "tokenizer": tokenizer.name,
        "tokens": {name: len(ids[name]) for name in SPLITS},
        "bits_per_byte": "exact (one token per byte)"
        if tokenizer.bytes_level
        else "estimated: tokens scored × the split's UTF-8 bytes per token",
    }
    return LMData(
        ids["train"], ids["valid"], ids["test"], tokenizer.vocab_size, tokenizer, num_bytes, info
    )


def unigram_bits_per_byte(data: LMData) -> float:
    """Cross-entropy of the validation split under the add-one-smoothed unigram distribution of
    the training split, in bits per UTF-8 byte (the baseline a model must beat)."""
    counts = torch.bincount(data.train, minlength=data.vocab_size).double() + 1.0
    log_p = counts.log() - counts.sum().log()
    valid = torch.bincount(data.valid, minlength=data.vocab_size).double()
    nats = -float((valid * log_p).sum())
    return nats / math.log(2) / max(data.num_bytes["valid"], 1)


# ------------------------------------------------------------------------------------ helpers
def _read(path: Path) -> bytes:
    if not path.is_file():
        raise DataFormatError(f"{path} is missing: expected a UTF-8 text file there")
    data = path.read_bytes()
    if not data.strip():
        raise DataFormatError(f"{path} is empty: expected UTF-8 text")
    return data


def _concatenate(parts: list[bytes]) -> bytes:
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)


def _wikitext(root: Path, variant: str, names: tuple[str, ...]) -> Corpus:
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise DataFormatError(
            f"{root} is a WikiText folder without {', '.join(missing)}: expected {', '.join(names)}"
        )
    splits = [_read(root / name) for name in names]
    info = {"layout": f"wikitext-{variant}", "path": str(root), "files": list(names)}
    return _corpus(splits, info)


def _split_corpus(data: bytes, info: dict[str, Any]) -> Corpus:
    fractions = list(SPLIT_FRACTIONS)
    return _corpus(split_bytes(data), {**info, "split": {"fractions": fractions}})


def _corpus(splits: list[bytes], info: dict[str, Any]) -> Corpus:
    digest = hashlib.sha256()
    for part in splits:
        digest.update(part)
    info = {
        **info,
        "bytes": {name: len(part) for name, part in zip(SPLITS, splits, strict=True)},
        "sha256": digest.hexdigest(),
    }
    return Corpus(splits[0], splits[1], splits[2], info)


def _listed(names: list[str]) -> dict[str, Any]:
    listed: dict[str, Any] = {"num_files": len(names), "files": names[:LISTED_FILES]}
    if len(names) > LISTED_FILES:
        listed["files_listed"] = f"the first {LISTED_FILES} of {len(names)}"
    return listed


def _boundary(data: bytes, offset: int) -> int:
    """The offset just after the first newline at or after ``offset``; without one, the first
    UTF-8 character boundary at or after it."""
    newline = data.find(b"\n", offset)
    if newline >= 0:
        return newline + 1
    while offset < len(data) and data[offset] & 0xC0 == 0x80:  # a continuation byte
        offset += 1
    return offset
