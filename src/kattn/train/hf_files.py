"""The files of a local Hugging Face checkpoint, a folder written by ``save_pretrained``, as
``kattn train --from-hf`` and ``kattn convert --hf`` check them before transformers reads the
folder (nothing is ever downloaded).

A checkpoint is a ``config.json`` naming its ``model_type`` and the weights
(:data:`WEIGHT_FILES`). Its tokenizer, if saved, left at least one of
:data:`TOKENIZER_FILES`: without any, ``AutoTokenizer`` would build an empty tokenizer of the
model's type that maps every word to its unknown token. One file can be the whole tokenizer
(a WordPiece ``vocab.txt`` is BERT's).
"""

from __future__ import annotations

import json
from pathlib import Path

#: files of which a saved tokenizer has at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")  # fmt: skip
#: the weight files of a checkpoint (one of them).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip


def checkpoint_folder(path: str | Path, key: str) -> Path:
    """``path`` as a folder, if it holds a Hugging Face checkpoint.

    Args:
        path: the folder.
        key: the flag or field that gave it, to open the message with.

    Raises:
        ValueError: it is not a folder, has no ``config.json`` naming a ``model_type``, or no
            weights.
    """
    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model_type = config["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        model_type = None
    if not isinstance(model_type, str) or not any((folder / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(
            f"{key}: {str(path)!r} is not a Hugging Face checkpoint: expected a folder written "
            f"by save_pretrained, with a config.json naming its model_type and weights in one "
            f"of {', '.join(WEIGHT_FILES)} (checkpoints are read from disk only, never "
            f"downloaded)"
        )
    return folder


def has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a saved tokenizer (one of :data:`TOKENIZER_FILES`)."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)
