"""Whether a :class:`~kattn.train.config.RunConfig` can be run: every value in its range, the
values consistent with each other and with the task. Each refusal is a ``ValueError`` naming
the config key (``section.field``) and what it must be."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ..registry import MECHANISMS
from .config import AMP_DTYPES, SCHEDULES, TASKS, RunConfig
from .distributed import check_device
from .field_checks import refuse_text_fields
from .objectives import objective_of
from .schedules import ONE_CYCLE_FALLBACK_SHARE, one_cycle_warmup


def validate(config: RunConfig) -> RunConfig:
    """``config`` if its values are usable, else a ``ValueError`` naming the field."""
    _check_choices(config)
    check_device(config.train.device, "train.device")
    _check_ranges(config)
    if config.train.batch_size % config.optim.accumulate:
        raise ValueError(
            f"train.batch_size ({config.train.batch_size}) must be a multiple of "
            f"optim.accumulate ({config.optim.accumulate})"
        )
    _check_warmup(config)
    if config.model.dim % config.model.num_heads:
        raise ValueError(
            f"model.dim ({config.model.dim}) must be a multiple of model.num_heads "
            f"({config.model.num_heads})"
        )
    if config.data.max_len and config.data.truncate and config.data.truncate > config.data.max_len:
        raise ValueError(
            f"data.truncate ({config.data.truncate}) exceeds data.max_len ({config.data.max_len})"
        )
    _validate_task_fields(config)
    return config


def _check_choices(config: RunConfig) -> None:
    choices = {
        "data.task": (config.data.task, TASKS),
        "data.tokenization": (config.data.tokenization, ("official", "legacy")),
        "optim.schedule": (config.optim.schedule, SCHEDULES),
        "optim.amp_dtype": (config.optim.amp_dtype, AMP_DTYPES),
        "model.pooling": (config.model.pooling, ("mean", "cls")),
        "model.positions": (config.model.positions, ("learned", "sinusoidal", "none")),
    }
    for key, (choice, allowed) in choices.items():
        if choice not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {choice!r}")


def _check_ranges(config: RunConfig) -> None:
    model, optim, loop, data = config.model, config.optim, config.train, config.data
    counts: dict[str, int | None] = {
        "train.steps": loop.steps,
        "train.batch_size": loop.batch_size,
        "train.eval_every": loop.eval_every,
        "train.log_every": loop.log_every,
        "optim.accumulate": optim.accumulate,
        "model.dim": model.dim,
        "model.num_layers": model.num_layers,
        "model.num_heads": model.num_heads,
        "model.ffn_dim": model.ffn_dim,
        "data.max_len": data.max_len,  # the optional ones: None is the default
        "data.truncate": data.truncate,
        "train.eval_batches": loop.eval_batches,
        "train.early_stop": loop.early_stop,
        "model.head_hidden": model.head_hidden,
        "data.block_size": data.block_size,
    }
    for key, count in counts.items():
        if count is not None and count < 1:
            raise ValueError(f"{key} must be positive, got {count}")
    scales = {
        "optim.lr": (optim.lr, "the peak learning rate"),
        "optim.eps": (optim.eps, "AdamW's denominator term"),
        "model.embedding_std": (model.embedding_std, "the std of the embeddings' normal init"),
    }
    for key, (value, meaning) in scales.items():
        if not value > 0:
            raise ValueError(f"{key} must be positive ({meaning}), got {value}")
    clips = {
        "optim.grad_clip_value": (optim.grad_clip_value, "the largest |entry| a gradient keeps"),
        "optim.grad_clip_norm": (optim.grad_clip_norm, "the largest norm of all the gradients"),
    }
    for key, (clip, meaning) in clips.items():
        if clip is not None and not clip > 0:
            raise ValueError(f"{key} must be positive ({meaning}), got {clip}; null turns it off")
    if optim.warmup_steps < 0:
        raise ValueError(f"optim.warmup_steps must be ≥ 0, got {optim.warmup_steps}")
    if optim.weight_decay < 0:
        raise ValueError(f"optim.weight_decay must be ≥ 0, got {optim.weight_decay}")
    unit = {
        "optim.beta1": optim.beta1,
        "optim.beta2": optim.beta2,
        "model.dropout": model.dropout,
        "model.attention_dropout": model.attention_dropout,
        "optim.label_smoothing": optim.label_smoothing,  # read by translation and images
    }
    for key, value in unit.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{key} must be in [0, 1), got {value}")
    if not 0.0 <= loop.best_after <= 1.0:
        raise ValueError(f"train.best_after must be in [0, 1], got {loop.best_after}")


def _check_warmup(config: RunConfig) -> None:
    """Warn when the warm-up does not end before the run. The linear warm-ups then never reach
    their peak (LRA's Retrieval config warms up for 8000 steps of a 5000-step run); one-cycle's
    warm-up is a fraction of the run and must leave time to anneal, so it is shortened to
    :data:`~kattn.train.schedules.ONE_CYCLE_FALLBACK_SHARE` of the run (``kattn train --steps
    50`` with a preset's 100-step warm-up still trains sensibly)."""
    warmup, steps, schedule = config.optim.warmup_steps, config.train.steps, config.optim.schedule
    if schedule == "onecycle" and warmup >= steps and steps >= 3:
        warnings.warn(
            f"optim.warmup_steps ({warmup}) is not shorter than train.steps ({steps}), and "
            f"one-cycle must leave time to anneal: this run warms up for "
            f"{one_cycle_warmup(warmup, steps)} steps ({ONE_CYCLE_FALLBACK_SHARE:.0%} of the "
            f"run); set optim.warmup_steps below {steps} to choose",
            stacklevel=3,
        )
    if schedule != "onecycle" and warmup > steps:
        warnings.warn(
            f"optim.warmup_steps ({warmup}) is longer than train.steps ({steps}): the learning "
            f"rate rises for the whole run and ends at {steps / warmup:.0%} of its warm-up peak",
            stacklevel=3,
        )


def _validate_task_fields(config: RunConfig) -> None:
    data, attention = config.data, config.attention
    objective = objective_of(config)
    refuse_text_fields(config)  # every task: mlm's masking, glue and init_from are theirs
    objective.check_data_fields(config)
    if objective.needs_causal and not mechanism_supports_causal(attention.name, attention.options):
        raise ValueError(
            f"task {data.task} needs a causal mechanism, and {attention.name!r} has no causal "
            "form (supports_causal is False); see kattn list"
        )


def mechanism_supports_causal(name: str, options: Mapping[str, Any]) -> bool:
    """Whether mechanism ``name`` built with ``options`` has a causal form."""
    entry = MECHANISMS.get(name)
    return bool(entry.cls.capabilities(**{**entry.defaults, **options})["supports_causal"])
