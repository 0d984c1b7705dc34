"""Checkpoints written atomically: to a temporary file in the same folder, then renamed, so
an interrupted write never leaves a truncated checkpoint behind; and the run state they
record besides the modules' states."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

LAST = "last.pt"
BEST = "best.pt"


@dataclasses.dataclass
class RunState:
    """What a checkpoint records besides the modules' states.

    Attributes:
        best_valid: the validation metrics of the best checkpoint so far.
        window: summed training statistics since the last log (see
            :mod:`kattn.train.objectives`).
    """

    step: int = 0
    best_valid: dict[str, float] | None = None
    best_step: int | None = None
    stale_evals: int = 0
    stopped_early: bool = False
    train_time_s: float = 0.0
    wall_time_s: float = 0.0
    window: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0, 0.0])

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunState:
        """The state a checkpoint saved (``dataclasses.asdict``); checkpoints of older runs,
        which kept only the best validation accuracy, are read too."""
        values = dict(values)
        if "best_valid_accuracy" in values:
            accuracy = values.pop("best_valid_accuracy")
            values["best_valid"] = None if accuracy is None else {"accuracy": accuracy}
        return cls(**values)


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save(state)`` to ``path`` atomically."""
    atomic_write(path, lambda file: torch.save(state, file))


def save_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON at ``path`` (see :func:`json_text`), atomically."""
    text = json_text(value, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda file: file.write(text.encode()))


def json_text(value: Any, **options: Any) -> str:
    """``value`` as strict JSON: NaN and ±infinity (a diverged loss, the perplexity of a huge
    one) are written as null, which every JSON parser reads; objects JSON does not know are
    written as their ``str``."""
    return json.dumps(finite(value), allow_nan=False, default=str, **options)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, in any nesting of dicts, lists and tuples, made
    None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def load_checkpoint(
    path: Path, device: torch.device | str = "cpu", *, keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint` (tensors on ``device``) holding
    ``keys``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is damaged (cut short, not a checkpoint, or without ``keys``);
            the message names it and the run's other checkpoint.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # a cut-short or foreign file fails in many ways
        reason = f"cut short or not a checkpoint: {_first_sentence(err)}"
        raise ValueError(_damaged(path, reason)) from None
    if not isinstance(state, dict) or not set(keys) <= state.keys():
        raise ValueError(_damaged(path, f"not a kattn checkpoint: no {', '.join(keys)}"))
    return state


def load_model_state(
    model: nn.Module, path: Path, device: torch.device | str, *, keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Load the model of checkpoint ``path`` (a run's ``best.pt`` or ``last.pt``, holding
    ``keys`` besides ``model``) into ``model`` and return the checkpoint; a damaged
    checkpoint, or one of another model, raises a ValueError naming the file."""
    saved = load_checkpoint(path, device, keys=("model", *keys))
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as err:
        raise ValueError(
            f"{path} does not fit the model of {path.parent / 'config.json'} "
            f"({_first_sentence(err)}): was config.json edited after training?"
        ) from None
    return saved


def _damaged(path: Path, why: str) -> str:
    """What is wrong with checkpoint ``path`` and what the run folder still offers."""
    best, last = path.with_name(BEST), path.with_name(LAST)
    if path.name == LAST:
        instead = (
            f"{best} still holds the best model (kattn eval --run {path.parent} "
            f"--checkpoint best); resuming needs last.pt, so train again with another --out"
            if best.is_file()
            else "resuming needs last.pt: train again with another --out"
        )
    else:
        instead = (
            f"{last} holds the model of the last evaluation (--checkpoint last)"
            if last.is_file()
            else f"the run has no {last.name} to use instead: train it again"
        )
    return f"{path} is damaged ({why}); {instead}"


def _first_sentence(err: BaseException) -> str:
    text = str(err).strip().split(". ")[0]
    return text.splitlines()[0][:120] if text else type(err).__name__
