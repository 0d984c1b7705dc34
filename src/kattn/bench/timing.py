"""Timing and peak-memory measurement that is honest on shared, noisy machines.

Times are medians over repeats after warm-up (CUDA events on GPU); peak memory is the CUDA
allocator's peak on GPU and the peak of tracked tensor allocations (PyTorch profiler) on CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, min, max over ``repeats`` calls."""

    median: float
    min: float
    max: float
    repeats: int


def measure_time(
    fn: Callable[[], Any],
    *,
    repeats: int = 7,
    warmup: int = 2,
    device: torch.device | str = "cpu",
) -> Timing:
    """Run ``fn`` ``warmup`` times, then time ``repeats`` calls; report the median."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return Timing(statistics.median(times), min(times), max(times), repeats)


def peak_memory_bytes(fn: Callable[[], Any], *, device: torch.device | str = "cpu") -> int:
    """Peak bytes of tensor memory allocated while ``fn`` runs (inputs made before excluded)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    return _cpu_peak_bytes(fn)


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj`` (nested tuples, lists, dicts and dataclasses, such as a
    decoding state)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_in(x)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, f.name))


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (:func:`tensors_in`)."""
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def _cpu_peak_bytes(fn: Callable[[], Any]) -> int:
    # The profiler records every allocation and free with the running total of bytes its CPU
    # reporter tracks. That total is kept across profiling sessions and counts every block
    # allocated in an earlier session and freed outside one (a returned output, say) forever,
    # so the peak is taken against the total just before fn's first event, not against 0.
    # kineto prints a line at every profiler start and stop unless told otherwise
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            sizes = int(fields.alloc_size), int(fields.total_allocated)
            events.append((event.start_time_ns, *sizes))
        stack.extend(event.children)
    if not events:
        return 0
    events.sort()
    start = events[0][2] - events[0][1]
    return max(0, max(total for _, _, total in events) - start)


def machine_info(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on: processor, threads, library versions."""
    import kattn

    info: dict[str, Any] = {
        "kattn": kattn.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Rounds(NamedTuple):
    """Result of :func:`interleaved_rounds`: per-candidate medians and per-round medians."""

    seconds: dict[str, float]
    round_seconds: dict[str, list[float]]
    repeats: dict[str, int]


def interleaved_rounds(
    fns: dict[str, Callable[[], Any]],
    *,
    rounds: int = 7,
    seconds: float = 0.5,
    log: Callable[[str], None] | None = print,
    device: torch.device | str = "cpu",
) -> Rounds:
    """Time every candidate in ``rounds`` interleaved rounds (each warmed up, then about
    ``seconds`` of calls, at least 3); report the median of the round medians. Interleaving
    spreads the noise of a shared machine evenly over the candidates."""
    single = {
        name: measure_time(fn, repeats=1, warmup=1, device=device).median
        for name, fn in fns.items()
    }
    repeats = {name: max(3, min(50, round(seconds / max(s, 1e-9)))) for name, s in single.items()}
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            timing = measure_time(fn, repeats=repeats[name], warmup=1, device=device)
            per_round[name].append(timing.median)
        if log is not None:
            log(
                f"round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {per_round[n][-1] * 1e3:.1f} ms" for n in fns)
            )
    medians = {name: statistics.median(times) for name, times in per_round.items()}
    return Rounds(medians, per_round, repeats)


def results_stem(benchmark: str, info: dict[str, Any], device: str = "cpu") -> str:
    """File stem of a benchmark's results: ``<benchmark>-<device>-<processor or GPU>-
    torch<version>-kattn<version>`` (lower-case, dashes)."""
    hardware = info.get("gpu") if device.startswith("cuda") else None
    slug = re.sub(r"[^a-z0-9]+", "-", str(hardware or info["processor"]).lower()).strip("-")
    torch_version = str(info["torch"]).split("+")[0]
    return f"{benchmark}-{device}-{slug}-torch{torch_version}-kattn{info['kattn']}"


def write_results(
    out: Path, stem: str, report: dict[str, Any], markdown: str, *, log: bool = True
) -> Path:
    """Write ``<stem>.json`` (everything) and ``<stem>.md`` (the table) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    if log:
        print("\n" + markdown)
        print(f"written: {out / stem}.{{json,md}}")
    return out / stem
