"""What a run says about itself: the line it prints when it starts, and the contents of
``results.json`` when it ends."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import __version__
from .checkpoint import RunState
from .config import RunConfig
from .distributed import Processes
from .metrics import peak_memory
from .objectives import SPLITS, Objective


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def run_header(
    config: RunConfig,
    objective: Objective[Any],
    model: nn.Module,
    device: torch.device,
    procs: Processes,
    *,
    resumed_at: int | None = None,
) -> str:
    """One line: task, data (where from, split sizes), model size, mechanism, device and CPU
    threads (and processes, and the step a resumed run starts from)."""
    where = config.data.path or objective.embedded_data
    sizes = " / ".join(f"{objective.size(split):,} {split}" for split in SPLITS)
    processes = f", {procs.world_size} processes" if procs.distributed else ""
    resumed = "" if resumed_at is None else f"; resuming at step {resumed_at}"
    return (
        f"kattn train: task {config.data.task}, data {where} ({sizes} {objective.unit}), model "
        f"{num_parameters(model):,} parameters, mechanism {config.attention.name}, device "
        f"{device} ({torch.get_num_threads()} threads{processes}){resumed}"
    )


def run_results(
    config: RunConfig,
    objective: Objective[Any],
    model: nn.Module,
    state: RunState,
    test: dict[str, float],
    device: torch.device,
    procs: Processes,
) -> dict[str, Any]:
    """The contents of ``results.json`` (see docs/reproducing-lra.md)."""
    peak, kind = peak_memory(device)
    return {
        "task": objective.task,
        "mechanism": config.attention.name,
        "attention_options": config.attention.options,
        "steps": state.step,
        **objective.results(test, state.best_valid),
        "best_step": state.best_step,
        "stopped_early": state.stopped_early,
        "wall_time_s": state.wall_time_s,
        "train_time_s": state.train_time_s,
        **objective.rates(state.step, state.train_time_s, config.train.batch_size),
        "peak_memory_bytes": int(peak),
        "peak_memory_kind": kind,
        "num_parameters": num_parameters(model),
        "device": str(device),
        "world_size": procs.world_size,
        "versions": {"kattn": __version__, "torch": torch.__version__},
        "config": config.to_dict(),
    }
