"""Tokenizers of the language-modelling task: UTF-8 bytes, or a trained subword model.

Three kinds share one interface (:class:`Tokenizer`):

* :class:`ByteTokenizer` (the default) — ids are the UTF-8 bytes 0–255; every text round-trips
  and bits per byte are exact.
* :class:`HFTokenizer` — a HuggingFace ``tokenizers`` JSON file (``tokenizer.json``).
* :class:`SentencePieceTokenizer` — a sentencepiece ``.model`` file.

The subword kinds need the ``text`` extra (``pip install 'kattn[text]'``); they are imported
only when such a file is loaded. :func:`load_tokenizer` picks the kind from the file's suffix.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: file suffix → tokenizer kind, as :func:`load_tokenizer` reads them.
TOKENIZER_SUFFIXES = {".json": "huggingface", ".model": "sentencepiece"}

#: subword tokenizers encode long texts in pieces of about this many characters, cut after a
#: newline, so that no Python list of the whole corpus's ids is ever built.
ENCODE_CHUNK_CHARS = 1 << 20
#: how many such pieces are encoded at once.
ENCODE_BATCH = 16


class Tokenizer(ABC):
    """Text ↔ token ids.

    Attributes:
        name: a short description (kind and file name).
        vocab_size: ids are in ``[0, vocab_size)``.
        bytes_level: ids are UTF-8 bytes (one token per byte: bits per byte are exact).
        path: the file the tokenizer was read from (None for bytes).
    """

    name: str
    vocab_size: int
    bytes_level: bool = False
    path: Path | None = None
    kind: str

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """The ids of ``text``."""

    @abstractmethod
    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``."""

    @abstractmethod
    def token_to_id(self, piece: str) -> int | None:
        """The id of the vocabulary's piece ``piece`` (a subword as the vocabulary spells it,
        such as ``"▁the"`` or ``"[MASK]"``), or None when it has no such piece."""

    @abstractmethod
    def id_to_token(self, i: int) -> str | None:
        """The piece of id ``i``, or None when ``i`` is outside the vocabulary."""

    def encode_array(self, text: str | bytes) -> Tensor:
        """The ids of ``text`` as a 1-D tensor (int32), built a piece of whole lines at a time
        (about :data:`ENCODE_CHUNK_CHARS` characters each)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        pieces = list(_pieces(text))
        parts = [
            np.asarray(ids, dtype=np.int32)
            for start in range(0, len(pieces), ENCODE_BATCH)
            for ids in self.encode_batch(pieces[start : start + ENCODE_BATCH])
        ]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return torch.from_numpy(ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of each of ``texts`` (in parallel where the library can)."""
        return [self.encode(text) for text in texts]

    def save(self, folder: str | Path) -> str | None:
        """Copy the tokenizer's file into ``folder`` as ``tokenizer<suffix>`` and return that
        name (None for bytes: nothing to copy)."""
        if self.path is None:
            return None
        target = Path(folder) / f"tokenizer{self.path.suffix}"
        if target.resolve() != self.path.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.path, target)
        return target.name

    def describe(self) -> dict[str, Any]:
        """What a run records about the tokenizer: kind, file, its SHA-256, vocabulary size."""
        info: dict[str, Any] = {"kind": self.kind, "name": self.name}
        info["vocab_size"] = self.vocab_size
        info["bytes_level"] = self.bytes_level
        if self.path is not None:
            info["file"] = str(self.path)
            info["sha256"] = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return info


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0–255 (vocabulary 256); decoding replaces invalid sequences."""

    name = "bytes"
    kind = "bytes"
    vocab_size = 256
    bytes_level = True

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str | bytes) -> Tensor:
        """``(N,)`` uint8 ids, one per byte, without a Python list of them."""
        raw = text.encode("utf-8") if isinstance(text, str) else text
        if not raw:
            return torch.zeros(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return bytes(values).decode("utf-8", errors="replace")

    def token_to_id(self, piece: str) -> int | None:
        """None: ids are bytes, not pieces of a vocabulary."""
        return None

    def id_to_token(self, i: int) -> str | None:
        """None: ids are bytes, not pieces of a vocabulary."""
        return None


class HFTokenizer(Tokenizer):
    """A HuggingFace ``tokenizers`` JSON file; ids as the file defines them, special tokens
    not added (a corpus is one stream)."""

    kind = "huggingface"

    def __init__(self, path: str | Path) -> None:
        tokenizers = _require("tokenizers", "a HuggingFace tokenizer file (.json)")
        self.path = Path(path)
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as err:  # the library raises its own exception type
            raise ValueError(f"{self.path} is not a HuggingFace tokenizer file: {err}") from None
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        self.name = f"huggingface:{self.path.name}"

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [list(encoding.ids) for encoding in encodings]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return str(self._tokenizer.decode(values, skip_special_tokens=False))

    def token_to_id(self, piece: str) -> int | None:
        found = self._tokenizer.token_to_id(piece)
        return None if found is None else int(found)

    def id_to_token(self, i: int) -> str | None:
        if not 0 <= i < self.vocab_size:
            return None
        piece = self._tokenizer.id_to_token(i)
        return None if piece is None else str(piece)


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece ``.model`` file (its normalisation applies: it may not round-trip
    whitespace exactly)."""

    kind = "sentencepiece"

    def __init__(self, path: str | Path) -> None:
        sentencepiece = _require("sentencepiece", "a sentencepiece model (.model)")
        self.path = Path(path)
        try:
            self._model = sentencepiece.SentencePieceProcessor(model_file=str(self.path))
        except Exception as err:  # the library raises RuntimeError/OSError by version
            raise ValueError(f"{self.path} is not a sentencepiece model: {err}") from None
        self.vocab_size = int(self._model.get_piece_size())
        self.name = f"sentencepiece:{self.path.name}"

    def encode(self, text: str) -> list[int]:
        return list(self._model.encode(text, out_type=int))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._model.encode(texts, out_type=int)]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return str(self._model.decode(values))

    def token_to_id(self, piece: str) -> int | None:
        i = int(self._model.piece_to_id(piece))
        return i if self._model.id_to_piece(i) == piece else None  # unknown pieces map to <unk>

    def id_to_token(self, i: int) -> str | None:
        return str(self._model.id_to_piece(i)) if 0 <= i < self.vocab_size else None


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The tokenizer of ``path``: None → :class:`ByteTokenizer`; ``.json`` → a HuggingFace
    ``tokenizers`` file; ``.model`` → a sentencepiece model.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: another suffix, or a file the library cannot read.
        ImportError: the library of that kind is not installed (the message names the extra).
    """
    if path is None:
        return ByteTokenizer()
    file = Path(path)
    kind = TOKENIZER_SUFFIXES.get(file.suffix)
    if kind is None:
        accepted = ", ".join(f"{suffix} ({name})" for suffix, name in TOKENIZER_SUFFIXES.items())
        raise ValueError(
            f"{file}: unknown tokenizer kind {file.suffix or '(no suffix)'!r}; accepted files "
            f"are {accepted}, or none for UTF-8 bytes"
        )
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer file at {file}")
    return HFTokenizer(file) if kind == "huggingface" else SentencePieceTokenizer(file)


def _require(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"reading {what} needs the {module!r} package: pip install 'kattn[text]' "
            f"(or pip install {module})"
        ) from None


def _pieces(text: str) -> Iterator[str]:
    """``text`` in consecutive pieces of whole lines, each of about :data:`ENCODE_CHUNK_CHARS`
    characters (longer where a single line is)."""
    start = 0
    while start < len(text):
        end = start + ENCODE_CHUNK_CHARS
        if end < len(text):
            newline = text.rfind("\n", start, end)
            if newline < 0:  # one long line: up to its end
                newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline + 1
        yield text[start:end]
        start = end
