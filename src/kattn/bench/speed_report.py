"""Results of the speed benchmark (:mod:`kattn.bench.speed`): markdown tables, CSV, JSON and the
log-log plot (what ``kattn bench speed`` writes and prints)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .speed import BASELINE, SpeedConfig, SpeedRow, crossovers, measure_speed
from .style import mechanism_color, pyplot, save_figure
from .timing import machine_info, results_stem


@dataclass(frozen=True)
class SpeedRun:
    """One run of :func:`benchmark_speed`: what was measured, on what, and the files written."""

    config: SpeedConfig
    rows: list[SpeedRow]
    machine: dict[str, Any]
    paths: list[Path]

    @property
    def markdown(self) -> str:
        """The run's tables (:func:`speed_markdown`)."""
        return speed_markdown(self.config, self.rows, self.machine)

    @property
    def failed(self) -> list[SpeedRow]:
        """The rows whose check against the dense reference failed."""
        return [r for r in self.rows if r.status.startswith("check failed")]


def benchmark_speed(
    config: SpeedConfig, out: Path, progress: Callable[[str], None] | None = None
) -> SpeedRun:
    """Measure every mechanism of ``config`` (:func:`~kattn.bench.speed.measure_speed`) and
    write the results into ``out`` (:func:`write_speed`)."""
    rows = measure_speed(config, progress=progress)
    info = machine_info(config.device)
    return SpeedRun(config, rows, info, write_speed(out, config, rows, info))


def describe(config: SpeedConfig, info: dict[str, Any]) -> str:
    """One line saying what was measured and on what."""
    hardware = info.get("gpu") or f"{info['processor']}, {info['torch_threads']} threads"
    size = "default sizes" if config.features is None else f"M={config.features}"
    return (
        f"B={config.batch}, H={config.heads}, D=Dv={config.head_dim}, {size}, {config.dtype}, "
        f"{config.mode} pass{', causal' if config.causal else ''}, {config.device} ({hardware}); "
        f"median of {config.rounds} interleaved rounds; kattn {info['kattn']}, "
        f"torch {info['torch']}"
    )


def skip_reason(row: SpeedRow) -> str | None:
    """Why ``row`` was skipped (None: it was not); runs written before the ``skipped`` field
    kept the reason in the status."""
    if row.skipped or not row.status.startswith("skipped"):
        return row.skipped
    return row.status.partition(":")[2].strip() or "no reason recorded"


def _cell(
    value: float | None, ratio: float | None, row: SpeedRow, marks: dict[tuple[str, int], int]
) -> str:
    if value is not None:
        return f"{value:.3g} ({ratio:.2g}×)" if ratio is not None else f"{value:.3g}"
    if (row.mechanism, row.length) in marks:
        return f"skipped [{marks[row.mechanism, row.length]}]"
    return "—" if row.status.startswith("unsupported") else row.status.split(":")[0]


def speed_markdown(config: SpeedConfig, rows: Sequence[SpeedRow], info: dict[str, Any]) -> str:
    """Time and memory tables (ratios to softmax in brackets), crossover lengths, notes;
    skipped cells are marked ``skipped [n]`` and note n says why."""
    lengths = sorted({r.length for r in rows})
    names = list(dict.fromkeys(r.mechanism for r in rows))
    at = {(r.mechanism, r.length): r for r in rows}
    skipped = [at[n, length] for n in names for length in lengths if skip_reason(at[n, length])]
    marks = {(r.mechanism, r.length): i for i, r in enumerate(skipped, start=1)}
    cross = {c.mechanism: c.describe() for c in crossovers(rows)}
    head = " | ".join(f"L={n:,}" for n in lengths)
    rule = "|---" * (len(lengths) + 2) + "|"  # mechanism, the lengths, one last column
    time_lines = [f"| mechanism | {head} | faster than softmax from L |", rule]
    memory_lines = [f"| mechanism | {head} | check error |", rule]
    for name in names:
        cells = [at[name, n] for n in lengths]
        times = " | ".join(_cell(r.time_ms, r.speedup, r, marks) for r in cells)
        mems = " | ".join(_cell(r.peak_memory_mib, r.memory_ratio, r, marks) for r in cells)
        errors = [r.check_error for r in cells if r.check_error is not None]
        check = f"{max(errors):.1e}" if errors else "—"
        time_lines.append(f"| {name} | {times} | {cross.get(name, 'baseline')} |")
        memory_lines.append(f"| {name} | {mems} | {check} |")
    notes = sorted(
        {f"- {r.mechanism}, L={r.length:,}: {r.status}" for r in rows
         if r.status != "ok" and not skip_reason(r)}
    )  # fmt: skip
    parts = [
        f"# Speed and memory against {BASELINE}\n\n{describe(config, info)}.",
        "## Time per call (ms; speed-up over softmax in brackets)\n\n" + "\n".join(time_lines),
        "## Peak memory (MiB; ratio to softmax in brackets)\n\n" + "\n".join(memory_lines),
        "Check error: the largest relative error of the output (and of the input gradients "
        "for a backward pass) against the mechanism's float64 dense reference, before timing.",
    ]
    if skipped:
        parts.append(
            "Skipped, predicted past the limits (not run):\n\n"
            + "\n".join(
                f"- [{marks[r.mechanism, r.length]}] {r.mechanism}, L={r.length:,}: "
                f"{skip_reason(r)}"
                for r in skipped
            )
        )
    if notes:
        parts.append("Not measured or not as usual:\n\n" + "\n".join(notes))
    return "\n\n".join(parts) + "\n"


def speed_csv(config: SpeedConfig, rows: Sequence[SpeedRow]) -> str:
    out = io.StringIO()
    settings = {k: v for k, v in asdict(config).items() if k not in ("mechanisms", "lengths")}
    fields = list(settings) + [k for k in asdict(rows[0]) if k != "options"] if rows else []
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        values = {k: v for k, v in asdict(row).items() if k != "options"}
        writer.writerow({**settings, **values})
    return out.getvalue()


def write_speed(
    out: Path, config: SpeedConfig, rows: Sequence[SpeedRow], info: dict[str, Any]
) -> list[Path]:
    """``<stem>.{csv,json,md,png}`` under ``out``; the stem names pass, dtype, device, the
    hardware and the library versions."""
    kind = f"speed-{config.mode}{'-causal' if config.causal else ''}-{config.dtype}"
    stem = results_stem(kind, info, config.device.split(":")[0])
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "speed",
        "machine": info,
        "config": asdict(config),
        "rows": [asdict(r) for r in rows],
        "crossovers": [asdict(c) for c in crossovers(rows)],
    }
    paths = [out / f"{stem}.csv", out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(speed_csv(config, rows))
    paths[1].write_text(json.dumps(report, indent=2) + "\n")
    png = plot_speed(rows, out / f"{stem}.png", describe(config, info))
    paths[2].write_text(render_speed_report(report, out / f"{stem}.png"))
    return paths + ([png] if png is not None else [])


def render_speed_report(report: dict[str, Any], png: Path) -> str:
    """The markdown of a speed run from its JSON ``report`` (as :func:`write_speed` writes
    it), with a link to the plot ``png`` where that exists: tables of earlier runs can be
    rendered again, without measuring, when the table format changes."""
    settings = report["config"]
    config = SpeedConfig(**{**settings, "mechanisms": tuple(settings["mechanisms"]),
                            "lengths": tuple(settings["lengths"])})  # fmt: skip
    rows = [SpeedRow(**row) for row in report["rows"]]
    markdown = speed_markdown(config, rows, report["machine"])
    if png.exists():
        markdown += f"\n![time and memory against length]({png.name})\n"
    return markdown


def plot_speed(rows: Sequence[SpeedRow], path: Path, caption: str = "") -> Path | None:
    """Time and peak memory against length, log-log, one colour per mechanism."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r.mechanism for r in rows):
        mine = sorted((r for r in rows if r.mechanism == name), key=lambda r: r.length)
        style = {"color": mechanism_color(name), "marker": "o", "markersize": 3, "label": name,
                 "linewidth": 2.2 if name == BASELINE else 1.2}  # fmt: skip
        for ax, attr in ((left, "time_ms"), (right, "peak_memory_mib")):
            points = [(r.length, getattr(r, attr)) for r in mine if getattr(r, attr)]
            if points:
                ax.plot(*zip(*points, strict=True), **style)
    for ax, label in ((left, "time per call (ms)"), (right, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    return save_figure(fig, path, caption)
