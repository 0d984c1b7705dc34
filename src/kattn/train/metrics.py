"""Where a run's numbers go: ``metrics.jsonl`` (one JSON object per logged step or
evaluation), TensorBoard when it is installed, and a progress bar (tqdm when installed, else a
line every log interval)."""

from __future__ import annotations

import json
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .checkpoint import json_text

METRICS = "metrics.jsonl"


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop the records after ``last_step`` (a resumed run repeats those steps), and a
    half-written last line (see :func:`read_metrics`)."""
    if not path.exists():
        return
    kept = [line for line, record in read_metrics(path) if record["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The lines of a ``metrics.jsonl`` and their records.

    A last line that is not a whole record is what a crash or power loss during a write
    leaves: it is dropped with a warning. A damaged line before it raises a ``ValueError``
    naming the file and the line.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    rows: list[tuple[str, dict[str, Any]]] = []
    for i, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except ValueError as err:
            problem = str(err)
        else:
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                rows.append((line, record))
                continue
            problem = "no integer 'step'"
        if i == len(numbered) - 1:
            warnings.warn(
                f"{path}, line {number} is cut short (a write interrupted by a crash or power "
                f"loss): dropped",
                stacklevel=3,
            )
            break
        raise ValueError(
            f"{path}, line {number} is not a JSON record ({problem}); expected one JSON "
            f"object with a 'step' per line"
        )
    return rows


class MetricsLog:
    """Appends records to ``<run>/metrics.jsonl`` and TensorBoard, and draws the progress.

    Args:
        run_dir: the run folder, or None in processes other than the first (they log nothing).
        total_steps, start_step: for the progress bar.
        progress: show a progress bar (stderr).
        tensorboard: also write TensorBoard events to ``<run>/tensorboard`` when the
            ``tensorboard`` package is installed.
    """

    def __init__(
        self,
        run_dir: Path | None,
        *,
        total_steps: int,
        start_step: int = 0,
        progress: bool = True,
        tensorboard: bool = True,
    ) -> None:
        self.path = None if run_dir is None else run_dir / METRICS
        self.writer: Any = None
        self.bar: Any = None
        self.total = total_steps
        self.started = time.perf_counter()
        if run_dir is None:
            return
        if tensorboard:
            self.writer = _summary_writer(run_dir / "tensorboard")
        if progress:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self.bar = _LineProgress(total_steps, start_step)
            else:
                self.bar = tqdm(total=total_steps, initial=start_step, unit="step", file=sys.stderr)

    def record(self, split: str, step: int, values: dict[str, Any]) -> None:
        """Append ``{"step", "split", **values}`` and show it."""
        if self.path is None:
            return
        row = {"step": step, "split": split, **values}
        with self.path.open("a") as file:
            file.write(json_text(row) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{split}/{key}", value, step)
        if isinstance(self.bar, _LineProgress):
            self.bar.show(split, step, values)

    def advance(self, step: int, postfix: dict[str, float]) -> None:
        """Move the bar to ``step`` (after an optimiser step) with ``postfix``."""
        if self.bar is None:
            return
        if isinstance(self.bar, _LineProgress):
            self.bar.n = step
            return
        self.bar.update(step - self.bar.n)
        if postfix:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def write(self, message: str) -> None:
        """A line for the user (above the bar)."""
        if self.path is None:
            return
        if self.bar is not None and not isinstance(self.bar, _LineProgress):
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None and not isinstance(self.bar, _LineProgress):
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


class _LineProgress:
    """The progress without tqdm: one line per logged record."""

    def __init__(self, total: int, start: int) -> None:
        self.total, self.n = total, start

    def show(self, split: str, step: int, values: dict[str, Any]) -> None:
        shown = " ".join(
            f"{k}={v:.4g}" for k, v in values.items() if isinstance(v, float) and k != "lr"
        )
        print(f"[{split}] step {step}/{self.total} {shown}", file=sys.stderr, flush=True)


def _summary_writer(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is not installed
        return None
    return SummaryWriter(str(folder))


def iter_records(run_dir: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (see :func:`read_metrics`)."""
    for _, record in read_metrics(Path(run_dir) / METRICS):
        yield record


def peak_memory(device: torch.device) -> tuple[int, str]:
    """The peak memory of the run so far and what it measures: CUDA's peak allocation on a
    GPU, else the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss"
