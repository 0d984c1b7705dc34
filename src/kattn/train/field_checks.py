"""Refusals of config fields that belong to another task than the run's: a field set for
nothing is an error naming its task, not silently ignored."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..nn.image_grid import IMAGE_POSITIONS
from .config import CLASSIFICATION_TASKS, TEXT_TASKS, DataConfig, ModelConfig, RunConfig

#: the data fields of the image tasks, and the model fields of the image classifier.
IMAGE_DATA_FIELDS = ("image_size", "crop_scale", "flip", "randaugment", "mixup", "cutmix")
IMAGE_MODEL_FIELDS = ("patch_size", "drop_path")


def refuse_unread_data_fields(config: RunConfig, names: tuple[str, ...], why: str = "") -> None:
    """``ValueError`` for a data field of ``names`` (None by default) set in a run whose task
    does not read it; ``why`` ends the message (``": set data.max_len"``)."""
    for name in names:
        if getattr(config.data, name) is not None:
            raise ValueError(f"data.{name} is not used by task {config.data.task}{why}")


def refuse_translation_fields(config: RunConfig, *, allow: tuple[str, ...] = ()) -> None:
    """``ValueError`` for a field of task ``translation`` set in a run of another task
    (those in ``allow``, dotted, are the run's own too)."""
    data, attention = config.data, config.attention
    fields = {f"data.{k}": getattr(data, k) for k in ("src", "tgt", "max_tokens", "bpe_size")}
    fields.update({f"attention.{k}": getattr(attention, k) or None
                   for k in ("decoder", "cross", "decoder_options", "cross_options")})  # fmt: skip
    fields["train.bleu_examples"] = config.train.bleu_examples
    fields["optim.label_smoothing"] = config.optim.label_smoothing or None
    for key, value in fields.items():
        if value is not None and key not in allow:
            raise ValueError(f"{key} is for task translation, not {data.task}")


def refuse_image_fields(config: RunConfig, *, allow: tuple[str, ...] = ()) -> None:
    """``ValueError`` for a field of the image tasks changed from its default in a run of
    another task (those in ``allow``, dotted, are the run's own)."""
    changed = _changed(config.data, DataConfig(), IMAGE_DATA_FIELDS, "data")
    changed += _changed(config.model, ModelConfig(), IMAGE_MODEL_FIELDS, "model")
    for key in changed:
        if key not in allow:
            owner = "image-classification" if key != "data.image_size" else "the image tasks"
            raise ValueError(f"{key} is for {owner}, not {config.data.task}")


#: the fields of the text tasks and of task mlm, dotted, with the tasks that read them.
TEXT_FIELD_TASKS = {
    "data.mask_prob": ("mlm",),
    "data.mask_token_share": ("mlm",),
    "data.random_token_share": ("mlm",),
    "data.whole_word_mask": ("mlm",),
    "data.glue": TEXT_TASKS,
    "model.init_from": ("finetune",),
    "model.init_from_hf": ("finetune",),
    # the encoders of TransformerEncoder (not translation's or the image models)
    "model.embedding_norm": (*CLASSIFICATION_TASKS, "lm", "mlm", *TEXT_TASKS),
}


def refuse_text_fields(config: RunConfig, names: dict[str, str] | None = None) -> None:
    """``ValueError`` for a field of task ``mlm`` (its masking) or of the text tasks
    (``data.glue``, ``model.init_from``, ``model.init_from_hf``), or ``model.embedding_norm``,
    changed from its default in a run of a task that does not read it. ``names``: how the
    message names a field (e.g. the command-line flag that set it), by its key."""
    task, defaults = config.data.task, RunConfig()
    for key, tasks in TEXT_FIELD_TASKS.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if task not in tasks and value != getattr(getattr(defaults, section), name):
            owner = " and ".join(tasks)
            raise ValueError(
                f"{(names or {}).get(key, key)} is for task{'s' if len(tasks) > 1 else ''} "
                f"{owner}, not {task}"
            )


def _changed(section: Any, default: Any, names: tuple[str, ...], prefix: str) -> list[str]:
    return [f"{prefix}.{n}" for n in names if getattr(section, n) != getattr(default, n)]


#: the model fields each image task reads; the others must keep their defaults.
IMAGE_TASK_MODEL_FIELDS = {
    "image-classification": ("dim", "num_layers", "num_heads", "ffn_dim", "pooling",
                             "positions", "norm_first", "dropout", "attention_dropout",
                             "patch_size", "drop_path"),
    "image-generation": ("dim", "num_layers", "num_heads", "ffn_dim", "positions", "dropout",
                         "attention_dropout"),
}  # fmt: skip


def refuse_unread_model_fields(config: RunConfig, read: tuple[str, ...]) -> None:
    """``ValueError`` for a model field changed from its default that the run's task does not
    ``read``, for absolute ``positions`` other than learned or none, and for a patch size
    below one pixel."""
    task, model, default = config.data.task, config.model, ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name not in read and getattr(model, f.name) != getattr(default, f.name):
            raise ValueError(
                f"model.{f.name} is not used by task {task} (it reads model."
                f"{', model.'.join(read)})"
            )
    if model.positions not in IMAGE_POSITIONS:
        raise ValueError(
            f"model.positions must be learned or none for task {task}, got {model.positions!r}"
        )
    if model.patch_size is not None and model.patch_size < 1:
        raise ValueError(
            f"model.patch_size must be a positive number of pixels, got {model.patch_size}"
        )
