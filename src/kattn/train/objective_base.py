"""The interface every task's objective implements (:class:`Objective`); the objectives
themselves are in :mod:`kattn.train.objectives` and :mod:`kattn.train.translation`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from ..data import Tokenizer
from .config import RunConfig

SPLITS = ("train", "valid", "test")

#: the data an objective reads: :class:`~kattn.data.TaskData` or :class:`~kattn.data.LMData`.
D = TypeVar("D")


class Objective(ABC, Generic[D]):
    """A task's data, model, batches, loss and metrics (see the module docstring), built
    from the run's config and the data :meth:`load_data` read.

    Attributes:
        task: the task's name.
        best_metric, higher_is_better: the validation metric that picks the best checkpoint.
        count_key: the metric counting what was scored (left out of the training logs).
        shown: the training metrics on the progress bar.
        embedded_data: the data a run reads when ``data.path`` is not given (run header).
        unit: what a split counts, after its size in the run header.
        paper_preset: the preset of the paper a run with data of its own reproduces by default.
        summary_keys: the results a finished ``kattn train`` prints.
        needs_causal: the task's model attends causally (a mechanism without a causal form
            is refused).
        one_batch_per_micro: an example is a whole batch (translation's token batches), so
            each micro-batch must be one example.
    """

    task: str
    best_metric: str
    higher_is_better: bool
    count_key: str
    shown: tuple[str, ...]
    embedded_data: str
    unit: str
    paper_preset: str
    summary_keys: tuple[str, ...]
    needs_causal: bool = False
    one_batch_per_micro: bool = False

    @staticmethod
    def has_embedded_data(task: str) -> bool:
        """Whether ``task`` runs on :attr:`embedded_data` when no ``data.path`` is given."""
        return True

    @staticmethod
    @abstractmethod
    def check_data_fields(config: RunConfig) -> None:
        """``ValueError`` for a ``data.*`` field the task does not use."""

    def __init__(self, config: RunConfig, data: D) -> None:
        self.data = data

    @classmethod
    @abstractmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> D:
        """The task's data as ``config`` says, with the files of run folder ``run_dir`` when
        given (a resumed or finished run)."""

    @classmethod
    @abstractmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The (untrained) model of run folder ``run_dir`` with ``config``, and its tokenizer
        (None when the task has none)."""

    @abstractmethod
    def build_model(self, config: RunConfig) -> nn.Module:
        """The (untrained) model that ``config`` trains on the data (seeded by the caller)."""

    def write_run_files(self, run_dir: Path) -> None:
        """Write what the run folder needs besides ``config.json`` to use the model later
        (nothing unless the task says)."""

    @abstractmethod
    def size(self, split: str) -> int:
        """How many examples (blocks) ``split`` has."""

    def eval_index(self, split: str, limit: int | None, seed: int) -> Tensor:
        """The examples an evaluation of ``split`` reads: all of them in order, or the first
        ``limit``."""
        return torch.arange(min(self.size(split), limit or self.size(split)))

    @abstractmethod
    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        """The tensors of examples ``index`` of ``split`` on ``device``."""

    @abstractmethod
    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """The model's logits on ``batch``."""

    @abstractmethod
    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        """The cross-entropy of ``logits`` (its mean or sum over what is scored)."""

    @abstractmethod
    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        """How many predictions are right, and how many were scored."""

    @abstractmethod
    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        """The metrics of summed statistics ``[loss_sum, correct, count]`` over ``split``."""

    def rates(self, steps: int, seconds: float, batch_size: int) -> dict[str, float]:
        """Throughput after ``steps`` optimiser steps in ``seconds`` of training."""
        return {"steps_per_s": steps / max(seconds, 1e-9)}

    def improved(self, metrics: dict[str, float], best: dict[str, float] | None) -> bool:
        """Whether validation ``metrics`` beat the ``best`` so far."""
        if best is None:
            return True
        new, old = metrics[self.best_metric], best[self.best_metric]
        return new > old if self.higher_is_better else new < old

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """Entries of ``results.json`` computed with the best model after the test loss
        (nothing unless the task says: translation's BLEU)."""
        return {}

    @abstractmethod
    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        """The task's entries of ``results.json`` (test metrics, best validation, baseline,
        data description)."""

    @abstractmethod
    def summary(self, results: dict[str, Any]) -> str:
        """The line a finished run prints."""


def shuffled_index(n: int, limit: int | None, seed: int) -> Tensor:
    """Every one of ``n`` examples in order, or the first ``limit`` of an order shuffled with
    ``seed`` (the same examples at every evaluation)."""
    if limit is not None and limit < n:
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(n, generator=generator)[:limit]
    return torch.arange(n)


def token_metrics(sums: list[float], count_key: str) -> dict[str, float]:
    """The metrics of a task that predicts tokens, from summed ``[nats, correct, count]``:
    the loss (mean nats per scored token), its perplexity (inf past ``exp(700)``), top-1
    accuracy, and the count of scored tokens as ``count_key``."""
    nats, correct, n = sums
    loss = nats / max(n, 1)
    return {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "accuracy": correct / max(n, 1),
        count_key: int(n),
    }


def token_rates(steps: int, seconds: float, tokens: float) -> dict[str, float]:
    """Optimiser steps and ``tokens`` (read in those steps) per second of ``seconds``."""
    return {
        "steps_per_s": steps / max(seconds, 1e-9),
        "tokens_per_s": tokens / max(seconds, 1e-9),
    }


class ClassAccuracy:
    """The counts and metrics of a task that predicts one class per example from
    ``batch["labels"]``: top-1 accuracy and the loss per example."""

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        labels = batch["labels"]
        return int((logits.argmax(-1) == labels).sum().item()), len(labels)

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        loss, correct, n = sums
        return {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1), "examples": int(n)}
