"""One training loop for every task: :func:`train` a run, :func:`evaluate_run` it again.

What differs between tasks — batches, loss, metrics, which validation result is best — is the
task's :class:`~kattn.train.objectives.Objective` (classification or language modelling).

A run folder holds ``config.json`` (the resolved config), ``metrics.jsonl``, ``last.pt`` (all
the state needed to continue: model, optimiser, schedule, gradient scaler, step, best so far),
``best.pt`` (the model of the best validation result: highest accuracy, or lowest loss for
``lm``), the tokenizer file of an ``lm`` run that has one, and at the end ``results.json``.

Runs are reproducible and resumable exactly: global batch ``s`` is a fixed slice of seeded
permutations of the training set, and the random state of step ``s`` (dropout, feature
redraws) is seeded from ``(seed, s, rank)``, so a run resumed from any checkpoint takes the
same steps as one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from contextlib import nullcontext, suppress
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .batches import BatchOrder
from .checkpoint import (
    BEST,
    LAST,
    RunState,
    load_model_state,
    save_checkpoint,
    save_json,
)
from .config import RunConfig, load_config
from .distributed import (
    Processes,
    close_processes,
    init_processes,
    processes_from_env,
    resolve_device,
)
from .metrics import METRICS, MetricsLog, truncate_metrics
from .objectives import objective_of
from .schedules import build_optimizer
from .summary import run_header, run_results
from .validation import validate

CONFIG = "config.json"
RESULTS = "results.json"


class Interrupted(RuntimeError):
    """The run stopped before its last step, by signal ``signum`` or, when that is None, as
    ``stop_after`` asked; ``last.pt`` holds it."""

    def __init__(self, run_dir: Path, step: int, signum: int | None = None) -> None:
        why = "as asked" if signum is None else f"by {signal.Signals(signum).name}"
        super().__init__(
            f"stopped at step {step} {why}; continue with: kattn train --out {run_dir} --resume"
        )
        self.run_dir, self.step, self.signum = run_dir, step, signum


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
        ValueError: ``stop_after`` is not a positive step after the one resumed from.
    """
    if stop_after is not None and (isinstance(stop_after, bool) or stop_after < 1):
        raise ValueError(f"stop_after must be a positive step, got {stop_after}")
    run = Path(run_dir)
    procs = processes_from_env()
    if resume:
        if not (run / CONFIG).is_file():
            raise FileNotFoundError(f"{run} holds no run to resume (no {CONFIG})")
        config = load_config(run / CONFIG)
    elif (run / LAST).exists() or (run / RESULTS).exists():
        raise FileExistsError(f"{run} already holds a run; pass --resume or another --out")
    validate(config)
    device = resolve_device(config.train.device, procs)
    joined = init_processes(procs, device)
    try:
        return _Run(config, run, procs, device, from_run=resume).train(resume, progress, stop_after)
    finally:
        if joined:
            close_processes()


class _Run:
    """A run's data, model, optimiser and state; ``from_run`` reads the data with the run
    folder's files (an ``lm`` run's tokenizer), for a resumed or finished run."""

    def __init__(
        self,
        config: RunConfig,
        run: Path,
        procs: Processes,
        device: torch.device,
        *,
        from_run: bool = False,
    ) -> None:
        self.config, self.run, self.procs, self.device = config, run, procs, device
        loop = config.train
        if loop.batch_size % (procs.world_size * config.optim.accumulate):
            raise ValueError(
                f"train.batch_size ({loop.batch_size}) must be a multiple of the processes "
                f"({procs.world_size}) times optim.accumulate ({config.optim.accumulate})"
            )
        self.micro = loop.batch_size // (procs.world_size * config.optim.accumulate)
        kind = objective_of(config)
        files = run if from_run else None
        if kind.one_batch_per_micro and self.micro != 1:
            raise ValueError(
                f"task {config.data.task}'s examples are batches already (of data.max_tokens "
                f"tokens): train.batch_size ({loop.batch_size}) must equal the processes "
                f"({procs.world_size}) times optim.accumulate ({config.optim.accumulate})"
            )
        if procs.is_main:  # the embedded data is generated once, by the first process
            run.mkdir(parents=True, exist_ok=True)
            self.objective = kind(config, kind.load_data(config, files))
            if not from_run:  # what the others read (a learnt vocabulary), written once
                self.objective.write_run_files(run)
        procs.barrier()
        if not procs.is_main:
            self.objective = kind(config, kind.load_data(config, run))
        torch.manual_seed(loop.seed)
        self.model = self.objective.build_model(config).to(device)
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
        self.order = BatchOrder(self.objective.size("train"), loop.batch_size, loop.seed)
        self.state = RunState()
        self.applied_lr = 0.0  # the learning rate of the last optimiser step
        self._signal: int | None = None

    # ---------------------------------------------------------------- the loop
    def train(self, resume: bool, progress: bool, stop_after: int | None) -> dict[str, Any]:
        loop, main = self.config.train, self.procs.is_main
        if resume:
            self._restore()
            if stop_after is not None and stop_after <= self.state.step:
                raise ValueError(
                    f"--stop-after ({stop_after}) is not after step {self.state.step}, where "
                    f"{self.run / LAST} resumes the run"
                )
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
        resumed_at = self.state.step if resume else None
        log.write(
            run_header(self.config, self.objective, self.model, self.device, self.procs,
                       resumed_at=resumed_at)
        )  # fmt: skip
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
                if self._signal is not None or (step == stop_after and step < loop.steps):
                    self._checkpoint(segment)
                    raise Interrupted(self.run, step, self._signal)
            return self._finish(log)
        finally:
            self._restore_signals(previous)
            log.close()

    def _step(self) -> None:
        config, procs, objective = self.config, self.procs, self.objective
        self.net.train()
        torch.manual_seed((config.train.seed * 1_000_003 + self.state.step) * 1024 + procs.rank)
        mine = self.order(self.state.step).view(procs.world_size, -1)[procs.rank]
        chunks = mine.split(self.micro)
        for i, index in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = nullcontext() if last or not procs.distributed else self.net.no_sync()  # type: ignore[operator]
            with sync, self._autocast():
                batch = objective.batch("train", index, self.device)
                logits = objective.forward(self.net, batch)
                loss = objective.loss(logits, batch)
                total = loss + self.model.regularization_loss()  # type: ignore[operator]
            self.scaler.scale(total / len(chunks)).backward()
            with torch.no_grad():
                correct, n = objective.counts(logits, batch)
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
        self.applied_lr = float(self.optimizer.param_groups[0]["lr"])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()  # the rate of the next step
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1

    def _autocast(self) -> Any:
        if not self.amp:
            return nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.amp_dtype)

    # ---------------------------------------------------------------- evaluation and logs
    def evaluate(self, split: str, limit: int | None = None) -> dict[str, float]:
        """The objective's metrics on ``split`` (all of it, or the first ``limit`` examples
        the objective picks), shared out over the processes."""
        objective = self.objective
        self.model.eval()
        index = objective.eval_index(split, limit, self.config.train.seed)
        index = index[self.procs.rank :: self.procs.world_size]
        totals = [0.0, 0.0, 0.0]
        with torch.no_grad(), self._autocast():
            for chunk in index.split(self.micro):
                batch = objective.batch(split, chunk, self.device)
                logits = objective.forward(self.model, batch).float()
                correct, n = objective.counts(logits, batch)
                totals[0] += objective.loss(logits, batch, reduction="sum").item()
                totals[1] += correct
                totals[2] += n
        return objective.metrics(self.procs.sum(totals, self.device), split)

    def _log_train(self, log: MetricsLog) -> None:
        sums = self.procs.sum(self.state.window, self.device)
        self.state.window = [0.0, 0.0, 0.0]
        objective, state = self.objective, self.state
        values = objective.metrics(sums, "train")
        del values[objective.count_key]
        values["lr"] = self.applied_lr  # that of the last step, not the next
        values.update(objective.rates(state.step, state.train_time_s, self.config.train.batch_size))
        log.record("train", state.step, values)
        log.advance(state.step, {k: values[k] for k in objective.shown})

    def _validate(self, log: MetricsLog) -> None:
        loop, state = self.config.train, self.state
        limit = None if loop.eval_batches is None else loop.eval_batches * loop.batch_size
        metrics = self.evaluate("valid", limit)
        counts = state.step >= loop.best_after * loop.steps
        improved = counts and self.objective.improved(metrics, state.best_valid)
        if improved:
            state.best_valid, state.best_step, state.stale_evals = dict(metrics), state.step, 0
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
        saved = load_model_state(
            self.model, self.run / LAST, self.device, keys=("optimizer", "scheduler", "state")
        )
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        self.state = RunState.from_dict(saved["state"])
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
            load_model_state(self.model, self.run / BEST, self.device)
        test = self.evaluate("test")
        log.record("test", state.best_step or state.step, test)
        results = run_results(
            self.config, self.objective, self.model, state, test, self.device, self.procs
        )
        if self.procs.is_main:
            results.update(self.objective.final_results(self.model, self.device))
        results["wall_time_s"] += time.perf_counter() - started
        if self.procs.is_main:
            save_json(self.run / RESULTS, results)
            log.write(f"{self.objective.summary(results)}; {self.run / RESULTS}")
        return results


def evaluate_run(
    run_dir: str | Path, split: str = "test", *, checkpoint: str = "best", device: str = "auto"
) -> dict[str, Any]:
    """Evaluate a run's ``best`` (or ``last``) model on ``split`` (``train``, ``valid``,
    ``test``) and return the task's metrics: loss, accuracy and number of examples; for ``lm``
    loss, perplexity, accuracy, bits per byte and number of tokens."""
    run = Path(run_dir)
    if split not in ("train", "valid", "test") or checkpoint not in ("best", "last"):
        raise ValueError(
            f"split must be train/valid/test and checkpoint best/last, got "
            f"{split!r}, {checkpoint!r}"
        )
    config = load_config(run / CONFIG)
    procs = Processes()
    config.train.device = device
    runner = _Run(config, run, procs, resolve_device(device, procs), from_run=True)
    saved = load_model_state(
        runner.model, run / (BEST if checkpoint == "best" else LAST), runner.device
    )
    step = saved["step"] if checkpoint == "best" else saved["state"]["step"]
    metrics = runner.evaluate(split)
    return {"run": str(run), "split": split, "checkpoint": checkpoint, "step": step, **metrics}
