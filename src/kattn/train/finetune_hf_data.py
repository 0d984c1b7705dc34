"""The start and the data of task ``finetune`` from a local Hugging Face checkpoint
(``model.init_from_hf``, ``kattn train --from-hf DIR``).

The checkpoint decides the model: :func:`adopt_hf` copies its shape and dropout into the
run's ``model`` fields (the others keep their defaults, unread) and :func:`check_hf_start`
refuses a run whose model fields say otherwise. The texts are those of the other text tasks
(:func:`kattn.train.finetune_data.read_texts`: AG News's layout, GLUE, the embedded set, the
same seeded hold-out), encoded by the checkpoint's own tokenizer (``AutoTokenizer``): a pair
as that tokenizer pairs its texts (``[CLS] a [SEP] b [SEP]`` with segment ids for BERT), cut
to ``data.max_len`` tokens (default and upper bound: the model's positions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoConfig, AutoTokenizer

from ..data import SequenceDataset
from ..data.text_examples import TextExamples, padded, rows_dataset
from .config import ModelConfig, RunConfig
from .finetune_data import TextTaskData, encode_text_task
from .hf_files import TOKENIZER_FILES, checkpoint_folder, has_tokenizer
from .hf_positions import hf_positions

#: the run folder's subfolder with the checkpoint's config and tokenizer (at the end: the
#: fine-tuned model, written by ``save_pretrained``).
RUN_FILES = "hf"
#: tokenizers whose ``model_max_length`` is at least this say no limit.
_NO_LIMIT = 10**6


def check_hf_checkpoint(path: str | Path) -> Path:
    """``path`` as a folder, if it holds a Hugging Face checkpoint with its tokenizer.

    Raises:
        ValueError: it is not a checkpoint (:func:`~kattn.train.hf_files.checkpoint_folder`)
            or has no tokenizer files (the message says what to add).
    """
    key = "model.init_from_hf (--from-hf)"
    folder = checkpoint_folder(path, key)
    if not has_tokenizer(folder):
        raise ValueError(
            f"{key}: {folder} holds no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): "
            f"the texts are encoded with the checkpoint's own tokenizer, so save it there too "
            f"(tokenizer.save_pretrained({str(folder)!r}))"
        )
    return folder


def hf_model_fields(hf_config: Any) -> dict[str, Any]:
    """The ``model`` fields a transformers config decides: width, layers, heads, the
    feed-forward width and the dropouts where the config names them."""
    fields = {
        "dim": int(hf_config.hidden_size),
        "num_layers": int(hf_config.num_hidden_layers),
        "num_heads": int(hf_config.num_attention_heads),
    }
    named = {
        "ffn_dim": ("intermediate_size", "n_inner"),
        "dropout": ("hidden_dropout_prob", "resid_pdrop", "hidden_dropout"),
        "attention_dropout": ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout"),
    }
    for field, names in named.items():
        values = [getattr(hf_config, n, None) for n in names]
        found = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if found:
            fields[field] = type(getattr(ModelConfig, field))(found[0])
    return fields


def hf_model_config(path: str) -> ModelConfig:
    """The ``model`` section of a run started from checkpoint ``path``."""
    folder = check_hf_checkpoint(path)
    return ModelConfig(**hf_model_fields(AutoConfig.from_pretrained(folder)), init_from_hf=path)


def adopt_hf(config: RunConfig, given: set[str]) -> RunConfig:
    """``config`` with the ``model`` fields of its checkpoint (``model.init_from_hf``), except
    those in ``given`` (dotted keys the user set), which must agree with the checkpoint's;
    checked as :func:`check_hf_start` checks, reading the checkpoint's config once."""
    check_hf_fields(config)
    adopted = hf_model_config(config.model.init_from_hf or "")
    for f in dataclasses.fields(ModelConfig):
        if f"model.{f.name}" not in given:
            setattr(config.model, f.name, getattr(adopted, f.name))
    refuse_other_model_fields(config, adopted)
    return config


def check_hf_start(config: RunConfig) -> None:
    """``ValueError`` for what a run started from a Hugging Face checkpoint cannot take
    (:func:`check_hf_fields`) and for ``model`` fields other than the checkpoint's (checked
    while its folder exists: a resumed or finished run needs only its run folder)."""
    check_hf_fields(config)
    path = config.model.init_from_hf or ""
    if Path(path).is_dir():
        refuse_other_model_fields(config, hf_model_config(path))


def check_hf_fields(config: RunConfig) -> None:
    """``ValueError`` for a run from a Hugging Face checkpoint without one
    (``model.init_from_hf``), with a second start (``model.init_from``) or with a tokenizer
    of kattn's (``data.tokenizer``); no file is read."""
    model, path = config.model, config.model.init_from_hf
    if path is None:
        raise ValueError("model.init_from_hf: no Hugging Face checkpoint is given (--from-hf)")
    if model.init_from is not None:
        raise ValueError(
            "model.init_from (--from RUN) and model.init_from_hf (--from-hf DIR) are two starts "
            "of one fine-tuning: give one"
        )
    if config.data.tokenizer is not None:
        raise ValueError(
            f"data.tokenizer (--tokenizer) is not used with --from-hf: the texts are encoded "
            f"with the tokenizer saved in {path}"
        )


def refuse_other_model_fields(config: RunConfig, adopted: ModelConfig) -> None:
    """``ValueError`` naming each ``model`` field of ``config`` that differs from
    ``adopted``, the checkpoint's (:func:`hf_model_config`)."""
    model = config.model
    differ = [
        f"model.{f.name} is {getattr(model, f.name)!r} here and {getattr(adopted, f.name)!r} "
        f"for the checkpoint"
        for f in dataclasses.fields(ModelConfig)
        if getattr(model, f.name) != getattr(adopted, f.name)
    ]
    if differ:
        raise ValueError(
            f"the model is the Hugging Face checkpoint {model.init_from_hf}, whose config.json "
            f"decides the model fields: {'; '.join(differ)}. Leave these fields out (kattn "
            f"train --from-hf takes them from the checkpoint)"
        )


def hf_max_len(config: RunConfig, hf_config: Any, tokenizer: Any) -> int:
    """Tokens per sequence: ``data.max_len``, by default the most the model takes (its
    positions, :func:`~kattn.train.hf_positions.hf_positions`, or the tokenizer's
    ``model_max_length`` where smaller).

    Raises:
        ValueError: ``data.max_len`` exceeds what the model takes.
    """
    limits = [hf_positions(hf_config), tokenizer.model_max_length]
    known = [int(n) for n in limits if isinstance(n, int) and 0 < n < _NO_LIMIT]
    limit = min(known) if known else None
    wanted = config.data.max_len
    if wanted is not None and limit is not None and wanted > limit:
        raise ValueError(
            f"data.max_len ({wanted}) exceeds the {limit} positions of the checkpoint "
            f"{config.model.init_from_hf}"
        )
    if wanted is None and limit is None:
        raise ValueError(
            f"data.max_len: the checkpoint {config.model.init_from_hf} gives no sequence "
            f"length (no max_position_embeddings); set data.max_len"
        )
    return int(wanted or limit)  # type: ignore[arg-type]


@dataclass
class HFRows(SequenceDataset):
    """Examples encoded by a transformers tokenizer: ``tokens`` (padded with its pad id),
    ``lengths``, ``labels`` and ``types``, the ``(N, L)`` segment ids where the tokenizer
    gives them (BERT's pairs), else None."""

    types: Tensor | None = None


@dataclass
class HFTaskData(TextTaskData):
    """:class:`~kattn.train.finetune_data.TextTaskData` encoded by a checkpoint's tokenizer
    (``vocab`` None); ``files`` is the run folder's :data:`RUN_FILES` when the tokenizer came
    from there (a resumed or finished run), else None (a new run: from the checkpoint)."""

    files: Path | None = None


def encode_hf(examples: TextExamples, tokenizer: Any, max_len: int) -> tuple[HFRows, int]:
    """``examples`` encoded by ``tokenizer`` (pairs as it pairs them), cut to ``max_len``
    tokens and padded to that length with its pad id; and how many fill all ``max_len``
    (those cut among them)."""
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "the checkpoint's tokenizer has no padding token: set one (tokenizer.pad_token = "
            "tokenizer.eos_token, and the model config's pad_token_id likewise) and save both"
        )
    encoded = tokenizer(examples.texts, examples.pairs, truncation=True, max_length=max_len)
    ids, types = encoded["input_ids"], encoded.get("token_type_ids")
    dtype = torch.int16 if len(tokenizer) < 2**15 else torch.int32
    data = rows_dataset(ids, examples.labels, tokenizer.pad_token_id, max_len, dtype)
    segments = None if types is None else padded(types, 0, max_len, torch.int8)
    rows = HFRows(data.tokens, data.lengths, data.labels, types=segments)
    return rows, int((data.lengths == max_len).sum())


def check_pad_ids(hf_config: Any, tokenizer: Any, source: Any) -> None:
    """Refuse a model config whose ``pad_token_id`` is not the tokenizer's: decoder-only
    classifiers (GPT-2, Llama...) pool the last token that is not ``config.pad_token_id``, so
    with another padding id they would read padding."""
    model_pad, pad = getattr(hf_config, "pad_token_id", None), tokenizer.pad_token_id
    if model_pad is not None and pad is not None and model_pad != pad:
        raise ValueError(
            f"{source}: the model config's pad_token_id is {model_pad} and the tokenizer pads "
            f"with {pad}: set config.pad_token_id = tokenizer.pad_token_id and save both"
        )


def run_files(run_dir: str | Path) -> Path:
    """The :data:`RUN_FILES` folder of run folder ``run_dir`` (a ``ValueError`` without
    one)."""
    files = Path(run_dir) / RUN_FILES
    if not files.is_dir():
        raise ValueError(f"{run_dir} holds no {RUN_FILES}/ folder of a --from-hf run")
    return files


def load_hf_task(config: RunConfig, run_dir: Path | None = None) -> HFTaskData:
    """The text task of ``config.data`` encoded by the tokenizer of checkpoint
    ``model.init_from_hf``, or of run folder ``run_dir``'s copy of it."""
    files = None if run_dir is None else run_files(run_dir)
    source = files or check_hf_checkpoint(config.model.init_from_hf or "")
    tokenizer = AutoTokenizer.from_pretrained(source)
    hf_config = AutoConfig.from_pretrained(source)
    check_pad_ids(hf_config, tokenizer, source)
    max_len = hf_max_len(config, hf_config, tokenizer)

    def encode(examples: TextExamples) -> tuple[SequenceDataset, int]:
        return encode_hf(examples, tokenizer, max_len)

    data = encode_text_task(config, encode, "filling_max_len", max_len, None, tokenizer)
    data.info["tokenizer"] = f"{type(tokenizer).__name__} of {config.model.init_from_hf}"
    return HFTaskData(**vars(data), files=files)
