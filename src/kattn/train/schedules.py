"""AdamW and the learning-rate schedules of the papers (see :class:`OptimConfig`)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

from .config import OptimConfig


def schedule_factor(name: str, step: int, warmup: int, total: int) -> float:
    """The multiplier of ``lr`` after ``step`` optimiser steps (``rsqrt``, ``cosine``,
    ``constant`` or ``linear``; ``onecycle`` is PyTorch's ``OneCycleLR``)."""
    ramp = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    if name == "rsqrt":  # lr · min(1, t/w) / √max(t, w), t counted from 1 as LRA does
        t = step + 1
        return ramp / math.sqrt(max(t, warmup, 1))
    if name == "cosine":
        if step < warmup:
            return ramp
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if name == "constant":
        return ramp
    if name == "linear":  # BERT's: to 0 at step `total`, as the KL-Transformer's min(i/w, …)
        if step < warmup:
            return ramp
        return max(0.0, (total - step) / max(1, total - warmup))
    raise ValueError(f"unknown schedule {name!r}")


#: one-cycle's share of the run spent warming up when the configured warm-up leaves no time to
#: anneal (PyTorch's ``OneCycleLR`` default)
ONE_CYCLE_FALLBACK_SHARE = 0.3


def one_cycle_warmup(warmup: int, total: int) -> int:
    """The warm-up steps one-cycle uses: ``warmup`` when it ends before the run does, else
    :data:`ONE_CYCLE_FALLBACK_SHARE` of the run (validation warns about the change)."""
    if warmup < total:
        return warmup
    return max(1, round(ONE_CYCLE_FALLBACK_SHARE * total))


class _OneCycle(OneCycleLR):
    """PyTorch's ``OneCycleLR`` holding its final rate once the cycle is done.

    Stepped once per optimiser step, the scheduler's last step computes the rate after the
    run, one step past the end of the anneal: the linear anneal extrapolated there is
    negative. From then on the rate stays at the cycle's last value (and β₁ where it was).
    """

    def get_lr(self) -> list[float | torch.Tensor]:
        if self.last_epoch >= self.total_steps:
            return [group["min_lr"] for group in self.optimizer.param_groups]
        return super().get_lr()


def build_optimizer(
    model: nn.Module, optim: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, LRScheduler]:
    """AdamW over every parameter and the schedule stepped once per optimiser step."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
    )
    scheduler: LRScheduler
    if optim.schedule == "onecycle" and total_steps >= 3:
        scheduler = _OneCycle(
            optimizer,
            max_lr=optim.lr,
            total_steps=total_steps,
            pct_start=min(
                max(one_cycle_warmup(optim.warmup_steps, total_steps), 2), total_steps - 1
            )
            / total_steps,
            anneal_strategy="linear",
        )
    else:
        name, warmup = optim.schedule, optim.warmup_steps
        if name == "onecycle":  # one or two steps: nothing to cycle
            name, warmup = "constant", 0
        scheduler = LambdaLR(
            optimizer, lambda step: schedule_factor(name, step, warmup, total_steps)
        )
    return optimizer, scheduler
