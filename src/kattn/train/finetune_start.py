"""Where task ``finetune`` starts from a kattn ``mlm`` run (``model.init_from``,
``kattn train --from RUN``): the run's checkpoint and encoder weights, its config, and the
encoder fields (:data:`ENCODER_FIELDS`) a fine-tuned model takes from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from .checkpoint import BEST, LAST, load_checkpoint
from .config import RunConfig, load_run_config
from .mlm_data import mlm_max_len

#: the fields that shape a pre-trained encoder: a fine-tuned model takes them from its run.
ENCODER_FIELDS = ("model.dim", "model.num_layers", "model.num_heads", "model.ffn_dim",
                  "model.positions", "model.norm_first", "model.block_skip", "model.out_proj",
                  "model.embedding_norm",
                  "attention.name", "attention.options", "data.tokenizer",
                  "data.max_len")  # fmt: skip


def start_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint of an ``mlm`` run that fine-tuning starts from: ``best.pt``, else
    ``last.pt``."""
    run = Path(run_dir)
    for name in (BEST, LAST):
        if (run / name).is_file():
            return run / name
    raise FileNotFoundError(f"{run} holds no checkpoint ({BEST} or {LAST}) to fine-tune from")


def start_encoder_state(checkpoint: Path) -> dict[str, Tensor]:
    """The encoder's weights in an ``mlm`` run's ``checkpoint``."""
    state = load_checkpoint(checkpoint, keys=("model",))["model"]
    prefix = "encoder."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def start_config(config: RunConfig) -> RunConfig:
    """The config of the ``mlm`` run ``model.init_from`` names.

    Raises:
        ValueError: no start is given, or it is not a run folder of task mlm.
    """
    start = config.model.init_from
    if start is None:
        raise ValueError(
            "task finetune needs a pre-trained run: give --from RUN (model.init_from), the "
            "folder of a kattn train --task mlm run"
        )
    saved = load_run_config(start, label=f"model.init_from={start!r}")
    if saved.data.task != "mlm":
        raise ValueError(
            f"model.init_from={start!r} is a run of task {saved.data.task}; fine-tuning starts "
            f"from a run of task mlm"
        )
    return saved


def _value(config: RunConfig, key: str) -> Any:
    section, name = key.split(".")
    if key == "data.max_len":
        return mlm_max_len(config)
    return getattr(getattr(config, section), name)


def check_start(config: RunConfig) -> None:
    """``ValueError`` listing the encoder fields of ``config`` that differ from its
    pre-trained run's (:data:`ENCODER_FIELDS`)."""
    saved = start_config(config)
    differ = [
        f"{key} is {_value(config, key)!r} here and {_value(saved, key)!r} in the run"
        for key in ENCODER_FIELDS
        if _value(config, key) != _value(saved, key)
    ]
    if differ:
        raise ValueError(
            f"the model differs from the pre-trained run {config.model.init_from}: "
            f"{'; '.join(differ)}. Fine-tuning keeps the encoder's shape and mechanism: leave "
            f"these fields out (kattn train --from takes them from the run)"
        )


def adopt_start(config: RunConfig, given: set[str]) -> RunConfig:
    """``config`` with the encoder fields of its pre-trained run, except those in ``given``
    (dotted keys the user set, ``attention.options.KEY`` for one option); then checked."""
    saved = start_config(config)
    for key in ENCODER_FIELDS:
        section, name = key.split(".")
        if key == "attention.options":
            own = {k: v for k, v in config.attention.options.items()
                   if f"attention.options.{k}" in given}  # fmt: skip
            config.attention.options = {**saved.attention.options, **own}
        elif key not in given:
            setattr(getattr(config, section), name, getattr(getattr(saved, section), name))
    check_start(config)
    return config
