"""One training loop for every task: :func:`train` a run, :func:`evaluate_run` it again.

A run folder holds ``config.json`` (the resolved config), ``metrics.jsonl``, ``last.pt`` (all
the state needed to continue: model, optimiser, schedule, gradient scaler, step, best so far),
``best.pt`` (the model of the best validation accuracy) and, at the end, ``results.json``.

Runs are reproducible and resumable exactly: global batch ``s`` is a fixed slice of seeded
permutations of the training set, and the random state of step ``s`` (dropout, feature
redraws) is seeded from ``(seed, s, rank)``, so a run resumed from any checkpoint takes the
same steps as one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import signal
import time
from contextlib import nullcontext, suppress
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from .. import __version__
from ..data import SequenceDataset
from .batches import BatchOrder, key_mask, majority_baseline, make_batch
from .checkpoint import BEST, LAST, load_checkpoint, save_checkpoint, save_json
from .config import RunConfig, validate
from .distributed import (
    Processes,
    close_processes,
    init_processes,
    processes_from_env,
    resolve_device,
)
from .metrics import METRICS, MetricsLog, truncate_metrics
from .schedules import build_optimizer
from .tasks import build_model, load_task

CONFIG = "config.json"
RESULTS = "results.json"


class Interrupted(RuntimeError):
    """The run stopped before its last step (signal or ``stop_after``); ``last.pt`` holds it."""

    def __init__(self, run_dir: Path, step: int) -> None:
        super().__init__(
            f"stopped at step {step}; continue with: kattn train --out {run_dir} --resume"
        )
        self.run_dir, self.step = run_dir, step


@dataclasses.dataclass
class RunState:
    """What a checkpoint records besides the modules' states."""

    step: int = 0
    best_valid_accuracy: float | None = None
    best_step: int | None = None
    stale_evals: int = 0
    stopped_early: bool = False
    train_time_s: float = 0.0
    wall_time_s: float = 0.0
    window: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0, 0.0])


def train(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train ``config`` in ``run_dir`` and return ``results.json``'s contents.

    Args:
        resume: continue from ``run_dir/last.pt`` (its ``config.json`` is used).
        progress: show the progress bar.
        stop_after: stop as if interrupted once this many steps are done (checkpointed).

    Raises:
        Interrupted: SIGINT/SIGTERM or ``stop_after``; ``last.pt`` holds the last finished step.
        FileExistsError: ``run_dir`` holds a run and ``resume`` is not set.
    """
    run = Path(run_dir)
    procs = processes_from_env()
    if resume:
        config = RunConfig.from_dict(json.loads((run / CONFIG).read_text()))
    elif (run / LAST).exists() or (run / RESULTS).exists():
        raise FileExistsError(f"{run} already holds a run; pass --resume or another --out")
    validate(config)
    device = resolve_device(config.train.device, procs)
    joined = init_processes(procs, device)
    try:
        return _Run(config, run, procs, device).train(resume, progress, stop_after)
    finally:
        if joined:
            close_processes()


class _Run:
    def __init__(self, config: RunConfig, run: Path, procs: Processes, device: torch.device):
        self.config, self.run, self.procs, self.device = config, run, procs, device
        loop = config.train
        if loop.batch_size % (procs.world_size * config.optim.accumulate):
            raise ValueError(
                f"train.batch_size ({loop.batch_size}) must be a multiple of the processes "
                f"({procs.world_size}) times optim.accumulate ({config.optim.accumulate})"
            )
        self.micro = loop.batch_size // (procs.world_size * config.optim.accumulate)
        if procs.is_main:  # the embedded data is generated once, by the first process
            run.mkdir(parents=True, exist_ok=True)
            self.data = load_task(config)
        procs.barrier()
        if not procs.is_main:
            self.data = load_task(config)
        torch.manual_seed(loop.seed)
        self.model = build_model(config, self.data).to(device)
        self.net: nn.Module = self.model
        if procs.distributed:
            ids = [device.index] if device.type == "cuda" else None
            self.net = DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer, self.scheduler = build_optimizer(self.model, config.optim, loop.steps)
        self.amp = config.optim.amp and device.type == "cuda"
        self.amp_dtype = getattr(torch, config.optim.amp_dtype)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=self.amp and self.amp_dtype == torch.float16
        )
        self.order = BatchOrder(len(self.data.train), loop.batch_size, loop.seed)
        self.state = RunState()
        self._signal: int | None = None

    # ---------------------------------------------------------------- the loop
    def train(self, resume: bool, progress: bool, stop_after: int | None) -> dict[str, Any]:
        loop, main = self.config.train, self.procs.is_main
        if resume:
            self._restore()
        elif main:
            save_json(self.run / CONFIG, self.config.to_dict())
            (self.run / METRICS).unlink(missing_ok=True)
        log = MetricsLog(
            self.run if main else None,
            total_steps=loop.steps,
            start_step=self.state.step,
            progress=progress,
            tensorboard=True,
        )
        segment = time.perf_counter()
        previous = self._catch_signals()
        try:
            while self.state.step < loop.steps and not self.state.stopped_early:
                started = time.perf_counter()
                self._step()
                self.state.train_time_s += time.perf_counter() - started
                step = self.state.step
                if step % loop.log_every == 0 or step == loop.steps:
                    self._log_train(log)
                log.advance(step, {})
                if step % loop.eval_every == 0 or step == loop.steps:
                    self._validate(log)
                    self._checkpoint(segment)
                    segment = time.perf_counter()
                if self._signal is not None or step == stop_after:
                    self._checkpoint(segment)
                    raise Interrupted(self.run, step)
            return self._finish(log)
        finally:
            self._restore_signals(previous)
            log.close()

    def _step(self) -> None:
        config, procs = self.config, self.procs
        self.net.train()
        torch.manual_seed((config.train.seed * 1_000_003 + self.state.step) * 1024 + procs.rank)
        mine = self.order(self.state.step).view(procs.world_size, -1)[procs.rank]
        chunks = mine.split(self.micro)
        for i, index in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = nullcontext() if last or not procs.distributed else self.net.no_sync()  # type: ignore[operator]
            with sync, self._autocast():
                batch = make_batch(self.data.train, index, self.device)
                logits = self._forward(batch)
                loss = F.cross_entropy(logits.float(), batch["labels"])
                total = loss + self.model.regularization_loss()  # type: ignore[operator]
            self.scaler.scale(total / len(chunks)).backward()
            with torch.no_grad():
                n = len(index)
                correct = (logits.argmax(-1) == batch["labels"]).sum().item()
                window = self.state.window
                window[0] += loss.item() * n
                window[1] += correct
                window[2] += n
        self.scaler.unscale_(self.optimizer)
        optim = config.optim
        if optim.grad_clip_value is not None:
            nn.utils.clip_grad_value_(self.model.parameters(), optim.grad_clip_value)
        if optim.grad_clip_norm is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), optim.grad_clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1

    def _forward(self, batch: dict[str, Tensor], net: nn.Module | None = None) -> Tensor:
        pad = self.config.data.pad_id_mask
        mask = key_mask(batch["tokens"], batch["lengths"], pad)
        net = net or self.net
        if "tokens2" in batch:
            mask2 = key_mask(batch["tokens2"], batch["lengths2"], pad)
            return net(batch["tokens"], batch["tokens2"], mask, mask2)
        return net(batch["tokens"], mask)

    def _autocast(self) -> Any:
        if not self.amp:
            return nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.amp_dtype)

    # ---------------------------------------------------------------- evaluation and logs
    def evaluate(self, split: SequenceDataset, limit: int | None = None) -> dict[str, float]:
        """Loss and accuracy on ``split`` (its first ``limit`` examples of a fixed shuffled
        order, or all of it in order), shared out over the processes."""
        self.model.eval()
        if limit is not None and limit < len(split):
            generator = torch.Generator().manual_seed(self.config.train.seed)
            index = torch.randperm(len(split), generator=generator)[:limit]
        else:
            index = torch.arange(len(split))
        index = index[self.procs.rank :: self.procs.world_size]
        totals = [0.0, 0.0, 0.0]
        with torch.no_grad(), self._autocast():
            for chunk in index.split(self.micro):
                batch = make_batch(split, chunk, self.device)
                logits = self._forward(batch, self.model).float()
                totals[0] += F.cross_entropy(logits, batch["labels"], reduction="sum").item()
                totals[1] += (logits.argmax(-1) == batch["labels"]).sum().item()
                totals[2] += len(chunk)
        loss, correct, n = self.procs.sum(totals, self.device)
        return {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1), "examples": int(n)}

    def _log_train(self, log: MetricsLog) -> None:
        loss, correct, n = self.procs.sum(self.state.window, self.device)
        self.state.window = [0.0, 0.0, 0.0]
        values: dict[str, float] = {
            "loss": loss / max(n, 1),
            "accuracy": correct / max(n, 1),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "steps_per_s": self.state.step / max(self.state.train_time_s, 1e-9),
        }
        log.record("train", self.state.step, values)
        log.advance(self.state.step, {k: values[k] for k in ("loss", "accuracy", "steps_per_s")})

    def _validate(self, log: MetricsLog) -> None:
        loop, state = self.config.train, self.state
        limit = None if loop.eval_batches is None else loop.eval_batches * loop.batch_size
        metrics = self.evaluate(self.data.valid, limit)
        counts = state.step >= loop.best_after * loop.steps
        best = state.best_valid_accuracy
        improved = counts and (best is None or metrics["accuracy"] > best)
        if improved:
            state.best_valid_accuracy, state.best_step, state.stale_evals = (
                metrics["accuracy"],
                state.step,
                0,
            )
            if self.procs.is_main:
                save_checkpoint(
                    self.run / BEST, {"model": self.model.state_dict(), "step": state.step}
                )
        elif counts:
            state.stale_evals += 1
            if loop.early_stop is not None and state.stale_evals >= loop.early_stop:
                state.stopped_early = True
                log.write(
                    f"early stop at step {state.step}: {state.stale_evals} evaluations "
                    f"without improvement"
                )
        log.record("valid", state.step, {**metrics, "best": improved})

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint(self, segment_start: float) -> None:
        now = time.perf_counter()
        self.state.wall_time_s += now - segment_start
        if self.procs.is_main:
            save_checkpoint(
                self.run / LAST,
                {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "state": dataclasses.asdict(self.state),
                },
            )
        self.procs.barrier()

    def _restore(self) -> None:
        saved = load_checkpoint(self.run / LAST, self.device)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        self.state = RunState(**saved["state"])
        if self.procs.is_main:
            truncate_metrics(self.run / METRICS, self.state.step)

    def _catch_signals(self) -> dict[int, Any]:
        if self.procs.distributed:
            return {}

        def stop(signum: int, frame: FrameType | None) -> None:
            self._signal = signum
            signal.signal(signum, signal.default_int_handler)  # a second one stops at once

        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            with suppress(ValueError):  # not the main thread: no handlers
                previous[signum] = signal.signal(signum, stop)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    # ---------------------------------------------------------------- the end
    def _finish(self, log: MetricsLog) -> dict[str, Any]:
        state, started = self.state, time.perf_counter()
        if (self.run / BEST).exists():
            self.model.load_state_dict(load_checkpoint(self.run / BEST, self.device)["model"])
        test = self.evaluate(self.data.test)
        log.record("test", state.best_step or state.step, test)
        results = self._results(test)
        results["wall_time_s"] += time.perf_counter() - started
        if self.procs.is_main:
            save_json(self.run / RESULTS, results)
            log.write(
                f"test accuracy {test['accuracy']:.4f} (best valid "
                f"{state.best_valid_accuracy} at step {state.best_step}); majority baseline "
                f"{results['majority_baseline']:.4f}; {self.run / RESULTS}"
            )
        return results

    def _results(self, test: dict[str, float]) -> dict[str, Any]:
        state, data = self.state, self.data
        if self.device.type == "cuda":
            peak, kind = torch.cuda.max_memory_allocated(self.device), "cuda_max_allocated"
        else:
            peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss"
        return {
            "task": data.task,
            "mechanism": self.config.attention.name,
            "attention_options": self.config.attention.options,
            "steps": state.step,
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "test_examples": test["examples"],
            "best_valid_accuracy": state.best_valid_accuracy,
            "best_step": state.best_step,
            "stopped_early": state.stopped_early,
            "majority_baseline": majority_baseline(data),
            "wall_time_s": state.wall_time_s,
            "train_time_s": state.train_time_s,
            "steps_per_s": state.step / max(state.train_time_s, 1e-9),
            "peak_memory_bytes": int(peak),
            "peak_memory_kind": kind,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "device": str(self.device),
            "world_size": self.procs.world_size,
            "versions": {"kattn": __version__, "torch": torch.__version__},
            "data": {k: v for k, v in data.info.items() if k != "vocabulary"},
            "config": self.config.to_dict(),
        }


def evaluate_run(
    run_dir: str | Path, split: str = "test", *, checkpoint: str = "best", device: str = "auto"
) -> dict[str, Any]:
    """Evaluate a run's ``best`` (or ``last``) model on ``split`` (``train``, ``valid``,
    ``test``) and return the loss, accuracy and number of examples."""
    run = Path(run_dir)
    if split not in ("train", "valid", "test") or checkpoint not in ("best", "last"):
        raise ValueError(
            f"split must be train/valid/test and checkpoint best/last, got "
            f"{split!r}, {checkpoint!r}"
        )
    config = RunConfig.from_dict(json.loads((run / CONFIG).read_text()))
    procs = Processes()
    config.train.device = device
    runner = _Run(config, run, procs, resolve_device(device, procs))
    saved = load_checkpoint(run / (BEST if checkpoint == "best" else LAST), runner.device)
    runner.model.load_state_dict(saved["model"])
    step = saved["step"] if checkpoint == "best" else saved["state"]["step"]
    metrics = runner.evaluate(getattr(runner.data, split))
    return {"run": str(run), "split": split, "checkpoint": checkpoint, "step": step, **metrics}
