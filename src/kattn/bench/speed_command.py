"""``kattn bench speed``: tables, CSV/JSON and the log-log plot of :mod:`kattn.bench.speed`."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .cli_types import device, int_at_least, int_list, name_list, output_folder, positive_float
from .speed import BASELINE, DTYPES, PASSES, SpeedConfig, SpeedRow, crossovers, measure_speed
from .style import mechanism_color, pyplot, save_figure
from .timing import machine_info, results_stem


def add_speed_parser(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "speed",
        help="time and peak memory of every mechanism against softmax, as the length grows",
        description="Each mechanism is first checked against its own float64 dense reference "
        "(output, and input gradients when a backward pass is timed), then timed in "
        "interleaved rounds with softmax (median of round medians; CUDA events on GPU) and "
        "its peak memory measured (CUDA allocator on GPU, tracked allocations on CPU). A "
        "length is skipped where the call is predicted (from the mechanism's complexity and "
        "its fastest round at the previous length) to pass --max-call-seconds, or its peak "
        "memory to pass --memory-limit-gb; the table marks it and says why. Writes CSV, JSON, "
        "a markdown table with the crossover length against softmax and a log-log plot; file "
        "names carry the device and the library versions.",
    )
    p.add_argument("--mechanisms", type=name_list, default=None,
                   help="comma-separated names (default: all)")  # fmt: skip
    p.add_argument("--lengths", type=int_list(2), default=None, help="default 256,1024,4096")
    p.add_argument("--batch", type=int_at_least(1), default=1)
    p.add_argument("--heads", type=int_at_least(1), default=4)
    p.add_argument("--head-dim", type=int_at_least(1), default=64)
    p.add_argument(
        "--features",
        type=int_at_least(1),
        default=None,
        help="the approximation size M of every mechanism that has one (num_features, "
        "num_landmarks or proj_dim; default: each mechanism's own default)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--pass", dest="mode", choices=PASSES, default="forward",
                   help="forward (no graph), backward (the backward alone) or both")  # fmt: skip
    p.add_argument("--causal", action="store_true", help="causal attention (skips the others)")
    p.add_argument("--repeats", type=int_at_least(1), default=None,
                   help="interleaved rounds (default 5)")  # fmt: skip
    p.add_argument("--seconds", type=positive_float, default=None,
                   help="time per round and mechanism (default 0.3)")  # fmt: skip
    p.add_argument("--check-max-length", type=int_at_least(0), default=2048,
                   help="check against the dense reference up to this length")  # fmt: skip
    p.add_argument("--max-call-seconds", type=positive_float, default=2.0,
                   help="skip a length where one call is predicted to take longer (the "
                   "fastest round at the previous length times the growth of the mechanism's "
                   "complexity)")  # fmt: skip
    p.add_argument("--memory-limit-gb", type=positive_float, default=8.0,
                   help="skip a length where peak memory is predicted to pass this")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_folder, default=Path("runs/bench/speed"))
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: lengths 128,256,512, 3 rounds of 0.05 s")  # fmt: skip
    p.set_defaults(func=cmd_bench_speed)


def config_from_args(args: argparse.Namespace) -> SpeedConfig:
    quick = bool(args.quick)
    return SpeedConfig(
        mechanisms=tuple(args.mechanisms.split(",")) if args.mechanisms else (),
        lengths=args.lengths or ((128, 256, 512) if quick else (256, 1024, 4096)),
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        features=args.features,
        dtype=args.dtype,
        device=args.device,
        mode=args.mode,
        causal=args.causal,
        rounds=args.repeats or (3 if quick else 5),
        seconds=args.seconds or (0.05 if quick else 0.3),
        check_max_length=args.check_max_length,
        max_call_seconds=args.max_call_seconds,
        memory_limit_bytes=int(args.memory_limit_gb * 2**30),
        seed=args.seed,
    )


def cmd_bench_speed(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    rows = measure_speed(
        config, progress=lambda text: print(f"speed: {text}", file=sys.stderr, flush=True)
    )
    info = machine_info(config.device)
    paths = write_speed(args.out, config, rows, info)
    print(speed_markdown(config, rows, info))
    print(f"written: {', '.join(str(p) for p in paths)}")
    failed = [r for r in rows if r.status.startswith("check failed")]
    return 1 if failed else 0


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
