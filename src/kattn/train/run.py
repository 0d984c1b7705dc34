"""A run's config from a preset or a saved config and a few settings (what ``kattn train``
resolves from its flags), and a trained run evaluated again (``kattn eval``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import save_json
from .config import RunConfig, load_config
from .loop import evaluate_run
from .objectives import objective_class
from .overrides import apply_overrides, drop_preset_options, drop_preset_part_options, preset


@dataclass(frozen=True)
class TrainOptions:
    """The settings of a training run on top of its preset (or saved config); None: the
    preset's. ``attention_options`` are ``KEY=VALUE`` mechanism options and ``overrides``
    ``SECTION.FIELD=VALUE`` config settings, applied in that order after the other fields."""

    config: str | None = None
    task: str | None = None
    preset: str | None = None
    data: str | None = None
    block_size: int | None = None
    tokenizer: str | None = None
    src: str | None = None
    tgt: str | None = None
    max_tokens: int | None = None
    level: str | None = None
    attention: str | None = None
    attention_options: tuple[str, ...] = ()
    steps: int | None = None
    batch_size: int | None = None
    eval_every: int | None = None
    seed: int | None = None
    device: str | None = None
    overrides: tuple[str, ...] = ()


def _start(options: TrainOptions) -> RunConfig:
    """The saved config of ``options.config``, else the preset: ``options.preset``, or
    ``skyformer`` (``luo-lm`` for lm, ``luo-mt`` for translation) with data or a task other
    than ListOps, else ``small``."""
    if options.config:
        if options.preset:
            raise ValueError("give --config or --preset, not both")
        config = load_config(options.config)
        if options.task:
            config.data.task = options.task
        return config
    task = options.task or "listops"
    objective = objective_class(task)
    embedded = objective.has_embedded_data(task) and not options.data
    name = options.preset or ("small" if embedded else objective.paper_preset)
    return preset(name, task)


def resolve_config(options: TrainOptions) -> tuple[RunConfig, list[str]]:
    """The run's config: preset (or saved config), then ``options``, then the overrides; and
    the attention options of the preset that the chosen mechanism does not take (left out)."""
    config = _start(options)
    preset_options = dict(config.attention.options)
    parts = {p: dict(getattr(config.attention, p)) for p in ("decoder_options", "cross_options")}
    if options.data:
        config.data.path = str(Path(options.data))
    if options.block_size is not None:
        config.data.block_size = options.block_size
    if options.tokenizer:
        config.data.tokenizer = str(Path(options.tokenizer))
    for key in ("src", "tgt", "max_tokens"):
        if getattr(options, key) is not None:
            setattr(config.data, key, getattr(options, key))
    if options.level:
        config.data.level = options.level
    if options.attention:
        config.attention.name = options.attention
    overrides = [f"attention.options.{item}" for item in options.attention_options]
    for key in ("steps", "batch_size", "eval_every", "seed"):
        if getattr(options, key) is not None:
            overrides.append(f"train.{key}={getattr(options, key)}")
    if options.device:
        config.train.device = options.device
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--attention-option is KEY=VALUE, got {item!r}")
    settings = overrides + list(options.overrides)
    apply_overrides(config, settings)
    prefix = "attention.options."
    given = [item[len(prefix) :].partition("=")[0] for item in settings if item.startswith(prefix)]
    dropped = drop_preset_options(config, preset_options, given)
    named = [item[len("attention.") :].partition("=")[0] for item in settings]
    return config, dropped + drop_preset_part_options(config, parts, named)


def evaluate_saved_run(
    run: str | Path, split: str = "test", *, checkpoint: str = "best", device: str = "auto"
) -> dict[str, Any]:
    """Evaluate the ``checkpoint`` of the run folder ``run`` on ``split`` again; the result is
    also written to ``run/eval-<split>-<checkpoint>.json``."""
    run = Path(run)
    if not (run / "config.json").is_file():
        raise ValueError(f"{run} is not a run folder (no config.json)")
    result = evaluate_run(run, split, checkpoint=checkpoint, device=device)
    save_json(run / f"eval-{split}-{checkpoint}.json", result)
    return result
