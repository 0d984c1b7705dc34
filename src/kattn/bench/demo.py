"""``kattn demo``: the embedded default main job, a measured comparison of the mechanisms.

On this machine, with nothing to download: speed and peak memory of every registered
mechanism against softmax at a few lengths, the approximation error of every approximate
mechanism against its exact counterpart, and a short ListOps training run of a handful of
mechanisms on generated data. Everything lands in one folder with ``report.md`` on top.

Each training run runs in a fresh process of its own, so that the peak memory it reports is
its own and not the largest of every run and benchmark before it in the demo's process.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..registry import MECHANISMS, available, build, spec
from .experiments import run_mechanisms
from .report import build_report
from .speed import SpeedConfig, SpeedRow, crossovers
from .speed_report import benchmark_speed
from .timing import machine_info

#: trained by the demo: exact softmax, FAVOR+, the RPE paper's NPRF, Skyformer, a learned kernel
TRAINED = ("softmax", "performer", "nprf_rpe", "skyformer", "gmm_prf")
#: the approximation size of every trained mechanism (features or landmarks): short sequences
TRAIN_SIZE = 64


@dataclass(frozen=True)
class DemoPlan:
    """How much the demo measures; :data:`FULL` took 9 minutes on 2 CPU cores (2026-11-24)."""

    lengths: tuple[int, ...]
    rounds: int
    seconds: float
    error_lengths: tuple[int, ...]
    error_seeds: int
    train_steps: int
    eval_every: int
    train_examples: tuple[int, int, int] | None  # None: the embedded ListOps set

    def describe(self) -> str:
        data = (
            "the embedded ListOps set"
            if self.train_examples is None
            else f"a {'/'.join(map(str, self.train_examples))} generated ListOps set"
        )
        return (
            f"speed at L={', '.join(map(str, self.lengths))}; error at "
            f"L={', '.join(map(str, self.error_lengths))}; {self.train_steps} training steps "
            f"on {data}"
        )


FULL = DemoPlan(lengths=(256, 1024, 4096), rounds=5, seconds=0.2, error_lengths=(1024,),
                error_seeds=3, train_steps=1000, eval_every=250, train_examples=None)  # fmt: skip
QUICK = DemoPlan(lengths=(64, 128), rounds=1, seconds=0.01, error_lengths=(128,),
                 error_seeds=1, train_steps=16, eval_every=8,
                 train_examples=(512, 64, 64))  # fmt: skip


def _say(text: str) -> None:
    print(f"demo: {text}", file=sys.stderr, flush=True)


def run_speed(out: Path, plan: DemoPlan, heads: int, log: Callable[[str], None]) -> list[SpeedRow]:
    config = SpeedConfig(lengths=plan.lengths, heads=heads, rounds=plan.rounds,
                         seconds=plan.seconds, check_max_length=1024)  # fmt: skip
    return benchmark_speed(config, out, progress=log).rows


def run_errors(out: Path, plan: DemoPlan, heads: int) -> dict[str, tuple[float, bool]]:
    """Relative error of every approximate mechanism against its exact counterpart (the
    ``kattn bench approx --experiment mechanisms`` study) at the plan's longest error length:
    ``{name: (error, has an exact counterpart)}``."""
    found = run_mechanisms(out, lengths=plan.error_lengths, dim=64, heads=heads,
                           seeds=plan.error_seeds, progress=_mechanisms_progress)  # fmt: skip
    longest = max(plan.error_lengths)
    return {
        r.mechanism: (r.rel_error, r.counterpart)
        for r in found.rows
        if r.length == longest and not r.causal
    }


def _mechanisms_progress(text: str) -> None:
    print(f"mechanisms: {text}", file=sys.stderr, flush=True)


def _listops(out: Path, plan: DemoPlan) -> str | None:
    """The data folder of the training runs (None: the embedded set, cached)."""
    if plan.train_examples is None:
        return None
    from ..data import generate_listops, write_listops
    from ..train.tasks import EMBEDDED_LISTOPS

    folder = out / "listops"
    if not (folder / "basic_test.tsv").exists():
        n_train, n_valid, n_test = plan.train_examples
        shape = {k: v for k, v in EMBEDDED_LISTOPS.items() if not k.startswith("num_")}
        splits = generate_listops(n_train, n_valid, n_test, **shape)
        write_listops(folder, splits)
    return str(folder)


#: the option that says how often a mechanism's random features are drawn anew
REDRAW_OPTIONS = ("redraw", "resample_every")


def redraw_plan(name: str, steps: int) -> tuple[dict[str, str], str | None]:
    """The options that keep ``name`` from drawing its random features anew at the last step
    of a ``steps``-step run when that would be its only redraw (just before the last
    evaluation, with no step left to adapt: the curve dips there), and a sentence saying what
    ``name`` does during the run (None: no random features, or no redraw before the end)."""
    from ..features.base import ResampledFeatureMap

    with torch.random.fork_rng(devices=[]):
        module = build(name, head_dim=8, num_heads=1, max_len=32)
    periods = [m.every for m in module.modules() if isinstance(m, ResampledFeatureMap)]
    every = min((p for p in periods if isinstance(p, int)), default=None)
    if every is None or every > steps:
        return {}, None
    last = f", the last time at step {steps}, just before the last evaluation"
    if every < steps:
        return {}, (
            f"{name} draws its random features anew every {every} training steps"
            + (last if steps % every == 0 else "")
        )
    entry = MECHANISMS.get(name)
    valid = entry.cls.option_names(entry.defaults) or []
    option = next((key for key in REDRAW_OPTIONS if key in valid), None)
    if option is None:
        return {}, f"{name} draws its random features anew once{last}"
    return (
        {option: "never"},
        f"{name} keeps its first draw of random features (its default redraw, every {every} "
        "steps, would come only at the last step, just before the last evaluation)",
    )


def _train_alone(config: Any, run_dir: Path, threads: int) -> dict[str, Any]:
    """Runs in a fresh process: the peak memory of the run is its own."""
    from ..train.loop import train

    torch.set_num_threads(threads)
    return train(config, run_dir, progress=True)


def _idle_peak() -> int:
    """The peak memory of a fresh process that imports the training loop and trains nothing."""
    from ..train.metrics import peak_memory

    return peak_memory(torch.device("cpu"))[0]


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a new process forked from multiprocessing's fork server (a small
    process that imports nothing of ours): the new process's peak resident set is its own.
    A process started by ``exec`` from this one would not do: Linux carries the peak of the
    process that called ``exec`` into the new program's ``ru_maxrss``."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def run_training(out: Path, plan: DemoPlan, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A short ListOps run of each mechanism in ``names`` (the ``small`` preset), each in a
    process of its own (:func:`in_fresh_process`; a script calling this needs the usual
    ``if __name__ == "__main__":`` guard of multiprocessing)."""
    from ..train.overrides import apply_overrides, preset
    from ..train.tasks import EMBEDDED_LISTOPS

    data = _listops(out, plan)
    results = {}
    for name in names:
        config = preset("small", "listops")
        config.attention.name = name
        config.data.path = data
        overrides = [f"train.steps={plan.train_steps}", f"train.eval_every={plan.eval_every}",
                     f"optim.warmup_steps={max(1, plan.train_steps // 10)}"]  # fmt: skip
        overrides += [f"attention.options.{key}={TRAIN_SIZE}" for key in _size_keys(name)]
        redraw, _ = redraw_plan(name, plan.train_steps)
        overrides += [f"attention.options.{key}={value}" for key, value in redraw.items()]
        if data is not None:  # padded to the longest generated expression, not LRA's 2000
            overrides.append(f"data.max_len={EMBEDDED_LISTOPS['max_length']}")
        apply_overrides(config, overrides)
        _say(f"training {name} for {plan.train_steps} steps")
        results[name] = in_fresh_process(_train_alone, config, out / name, torch.get_num_threads())
    return results


def _size_keys(name: str) -> list[str]:
    from .speed import size_options

    return list(size_options(name, TRAIN_SIZE))


def summary_table(
    speed: list[SpeedRow],
    errors: dict[str, tuple[float, bool]],
    trained: dict[str, dict[str, Any]],
) -> str:
    """One row per mechanism: error, speed and memory ratios at the longest length, crossover,
    ListOps accuracy of the trained ones."""
    longest = max(r.length for r in speed)
    at = {r.mechanism: r for r in speed if r.length == longest}
    cross = {c.mechanism: c.describe() for c in crossovers(speed)}
    head = (
        f"| mechanism | rel. error vs exact | speed-up vs softmax at L={longest:,} | memory vs "
        f"softmax at L={longest:,} | faster than softmax from L | ListOps test acc. |"
    )
    lines = [head, "|---|---|---|---|---|---|"]
    for name in [n for n in at if n == "softmax"] + sorted(n for n in at if n != "softmax"):
        row = at[name]
        exact = spec(name).is_exact and name not in errors  # pattern baselines err vs softmax
        error = "exact" if exact else _error(errors.get(name))
        speedup = f"{row.speedup:.2f}×" if row.speedup else row.status.split(":")[0]
        memory = f"{row.memory_ratio:.2f}×" if row.memory_ratio else "—"
        result = trained.get(name)
        accuracy = f"{100 * result['test_accuracy']:.1f}%" if result else ""
        crossover = "baseline" if name == "softmax" else cross.get(name, "n/a")
        lines.append(f"| {name} | {error} | {speedup} | {memory} | {crossover} | {accuracy} |")
    return "\n".join(lines)


def _error(found: tuple[float, bool] | None) -> str:
    if found is None:
        return "—"
    error, counterpart = found
    return f"{error:.3f}" if counterpart else f"({error:.3f} vs softmax)"


def training_notes(names: tuple[str, ...], steps: int, idle_bytes: int) -> str:
    """What the training table's peak memory measures and what the trained mechanisms do with
    their random features during the run."""
    text = (
        "Training runs: each ran in a fresh process of its own, and its peak memory is that "
        "process's: on CPU its peak resident set, which includes the Python interpreter, "
        f"PyTorch and kattn (a fresh process that imports them and trains nothing peaks at "
        f"{idle_bytes / 2**20:,.0f} MiB); on a GPU the CUDA allocator's peak."
    )
    notes = [note for name in names if (note := redraw_plan(name, steps)[1])]
    if notes:
        text += " Random features: " + "; ".join(notes) + "."
    return text


def run_demo(
    out: Path,
    plan: DemoPlan = FULL,
    *,
    heads: int = 4,
    trained: tuple[str, ...] = TRAINED,
) -> str:
    """Run the demo into ``out``; returns the summary table (also at the top of report.md)."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _say(f"{len(available())} mechanisms; {plan.describe()}; writing to {out}")
    speed = run_speed(out / "speed", plan, heads, lambda text: _say(f"speed: {text}"))
    _say("approximation error against the exact counterparts")
    errors = run_errors(out / "approx", plan, heads)
    results = run_training(out / "train", plan, trained)
    idle = in_fresh_process(_idle_peak)
    info = machine_info()
    table = summary_table(speed, errors, results)
    steps = f"{plan.train_steps} steps"
    intro = (
        f"# kattn demo\n\n{plan.describe()}; {time.strftime('%Y-%m-%d')}, "
        f"{info['processor']} ({info['torch_threads']} threads), kattn {info['kattn']}, "
        f"torch {info['torch']}; {time.perf_counter() - started:.0f} s in all.\n\n"
        f"## Summary\n\n{table}\n\nRel. error: ‖out − exact‖/‖exact‖ against the exact counterpart "
        f"(softmax; the Gaussian kernel for skyformer; in brackets: no exact counterpart, "
        f"compared with softmax), L={max(plan.error_lengths)}, at initialisation. "
        f"Speed and memory: forward pass, B=1, H={heads}, D=64, each mechanism's default "
        f"size. ListOps: the `small` preset, {steps}, {TRAIN_SIZE} features or landmarks."
        f"\n\n{training_notes(trained, plan.train_steps, idle)}"
    )
    report = out / "report.md"
    body = build_report([out / "speed", out / "approx", out / "train"], report)
    report.write_text(intro + "\n\n" + body.split("\n", 2)[2])
    _say(f"report: {report}")
    return table
