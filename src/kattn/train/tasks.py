"""From a :class:`RunConfig` to the task's data and model (the task's
:class:`~kattn.train.objectives.Objective` says which of these it uses).

``load_task`` reads a classification task's released files (``data.path``) with the
:mod:`kattn.data` loaders, cuts sequences to ``data.truncate`` and pads them to
``data.max_len``. ListOps with no path is the embedded default: a short ListOps set generated
once by :func:`kattn.data.generate_listops` and cached (``$KATTN_CACHE``, else
``~/.cache/kattn``) in the released TSV format. ``load_lm_data`` reads the corpus of task
``lm`` (:func:`kattn.data.load_corpus`; no path: the standard-library sources) and tokenises it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data import (
    LMData,
    SequenceDataset,
    TaskData,
    Tokenizer,
    generate_listops,
    load_corpus,
    load_image,
    load_listops,
    load_pathfinder,
    load_retrieval,
    load_text,
    load_tokenizer,
    tokenize_corpus,
    write_listops,
)
from ..data.cache import cache_dir, generated_folder, parameters_key
from ..nn import CausalLM, DualEncoderClassifier, SequenceClassifier
from .config import LM_BLOCK_SIZE, RunConfig

#: the length of every task in LRA (sequences are cut to it).
TASK_LENGTHS = {"listops": 2000, "text": 4000, "retrieval": 4000, "image": 1024, "pathfinder": 1024}

#: the embedded ListOps set: LRA's generator with short expressions (lengths 21–99 tokens,
#: depth ≤ 4), so that a small model learns it within minutes on a CPU.
EMBEDDED_LISTOPS: dict[str, int] = {
    "num_train": 20000,
    "num_valid": 1000,
    "num_test": 2000,
    "min_length": 20,
    "max_length": 100,
    "max_depth": 4,
    "max_args": 10,
    "seed": 0,
}


def embedded_listops(create: bool = True) -> Path:
    """The folder of the embedded ListOps set (generated there on first use)."""
    folder = cache_dir() / f"listops-embedded-{parameters_key(EMBEDDED_LISTOPS)}"
    if not create:
        return folder

    def write(partial: Path) -> None:
        splits = generate_listops(
            EMBEDDED_LISTOPS["num_train"],
            EMBEDDED_LISTOPS["num_valid"],
            EMBEDDED_LISTOPS["num_test"],
            **{k: v for k, v in EMBEDDED_LISTOPS.items() if not k.startswith("num_")},
        )
        write_listops(partial, splits)

    return generated_folder(folder, "basic_test.tsv", write)


def load_task(config: RunConfig) -> TaskData:
    """The classification task's splits, cut to ``data.truncate`` and padded to
    ``data.max_len``."""
    data = config.data
    task = data.task
    default = EMBEDDED_LISTOPS["max_length"] if task == "listops" and not data.path else None
    length = data.max_len or default or TASK_LENGTHS[task]
    cut = data.truncate or min(length, TASK_LENGTHS[task])
    if task == "listops":
        embedded = not data.path
        path = embedded_listops() if embedded else Path(data.path or "")
        loaded = load_listops(path, tokenization=data.tokenization, max_len=cut)
        loaded.info["embedded"] = dict(EMBEDDED_LISTOPS) if embedded else None
    elif data.path is None:
        raise ValueError(
            f"task {task!r} needs --data (the released files; see docs/reproducing-lra.md); "
            "only listops has an embedded default"
        )
    elif task == "text":
        loaded = load_text(data.path, max_len=cut)
    elif task == "retrieval":
        loaded = load_retrieval(data.path, max_len=cut)
    elif task == "image":
        loaded = load_image(data.path)
    else:
        loaded = load_pathfinder(data.path, level=data.level)
    return pad_task(loaded, length)


def pad_task(data: TaskData, length: int) -> TaskData:
    """``data`` with every split padded with id 0 (or cut) to ``length`` tokens."""
    if length == data.max_len:
        return data

    def fit(tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] >= length:
            return tokens[:, :length].contiguous()
        return F.pad(tokens, (0, length - tokens.shape[1]))

    def split(d: SequenceDataset) -> SequenceDataset:
        return SequenceDataset(
            fit(d.tokens),
            d.lengths.clamp(max=length),
            d.labels,
            None if d.tokens2 is None else fit(d.tokens2),
            None if d.lengths2 is None else d.lengths2.clamp(max=length),
        )

    return TaskData(
        data.task,
        split(data.train),
        split(data.valid),
        split(data.test),
        data.vocab_size,
        data.num_classes,
        length,
        data.info,
    )


def load_lm_data(config: RunConfig, tokenizer: Tokenizer | None = None) -> LMData:
    """The corpus of task ``lm`` tokenised by ``tokenizer`` (default: the one
    ``data.tokenizer`` names)."""
    data = config.data
    return tokenize_corpus(load_corpus(data.path), tokenizer or load_tokenizer(data.tokenizer))


def block_size(config: RunConfig) -> int:
    """Tokens per block of task ``lm`` (``data.block_size`` or :data:`LM_BLOCK_SIZE`)."""
    return config.data.block_size or LM_BLOCK_SIZE


def tokenizer_file(run_dir: str | Path, config: RunConfig) -> Path | None:
    """Where a run folder keeps its copy of the tokenizer file (None for bytes)."""
    if config.data.tokenizer is None:
        return None
    return Path(run_dir) / f"tokenizer{Path(config.data.tokenizer).suffix}"


def run_tokenizer(run_dir: str | Path, config: RunConfig) -> Tokenizer:
    """The tokenizer of a run: its copy in the run folder, else the file the config names."""
    copy = tokenizer_file(run_dir, config)
    return load_tokenizer(copy if copy is not None and copy.is_file() else config.data.tokenizer)


#: the keyword arguments of the encoder that the config gives, and the fields giving them.
ENCODER_KEYWORDS = {
    "dim": "model.dim",
    "depth": "model.num_layers",
    "num_heads": "model.num_heads",
    "ffn_dim": "model.ffn_dim",
    "positions": "model.positions",
    "norm_first": "model.norm_first",
    "dropout": "model.dropout",
    "attention_dropout": "model.attention_dropout",
    "block_skip": "model.block_skip",
    "out_proj": "model.out_proj",
    "embedding_std": "model.embedding_std",
    "embedding_norm": "model.embedding_norm",
    "mechanism": "attention.name",
}


def encoder_options(config: RunConfig) -> dict[str, Any]:
    """The keyword arguments of :class:`~kattn.nn.encoder.TransformerEncoder` (and of the
    models over it) that ``config`` gives: :data:`ENCODER_KEYWORDS` and the mechanism's
    options, which must not set one of those (``ValueError`` naming the field that does)."""
    for key, field in ENCODER_KEYWORDS.items():
        if key in config.attention.options:
            raise ValueError(
                f"attention.options must not hold {key!r}: the encoder's {key} is {field}"
            )
    values = {}
    for key, field in ENCODER_KEYWORDS.items():
        section, name = field.split(".")
        values[key] = getattr(getattr(config, section), name)
    return {**values, **config.attention.options}


def build_model(config: RunConfig, data: TaskData) -> nn.Module:
    """The classifier of ``config.model`` over classification ``data``, with
    ``config.attention`` in every layer (task ``lm`` builds :func:`build_lm`)."""
    m = config.model
    cls = DualEncoderClassifier if data.train.paired else SequenceClassifier
    return cls(
        data.vocab_size,
        data.max_len,
        data.num_classes,
        pooling=m.pooling,
        head_hidden=m.head_hidden,
        **encoder_options(config),
    )


def build_lm(config: RunConfig, vocab_size: int) -> CausalLM:
    """The :class:`~kattn.nn.CausalLM` of ``config.model`` over ``vocab_size`` ids, reading
    blocks of :func:`block_size` tokens, with ``config.attention`` in every layer."""
    return CausalLM(
        vocab_size,
        block_size(config),
        tie_embeddings=config.model.tie_embeddings,
        **encoder_options(config),
    )
