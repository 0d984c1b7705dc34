"""``kattn report``: training runs and benchmark outputs gathered into one markdown report.

Training runs are folders holding ``results.json`` (and ``metrics.jsonl``); benchmark outputs
are ``<stem>.json`` files with a ``"benchmark"`` key, written beside their ``<stem>.md``
table and ``<stem>.png`` plot. Both are found anywhere below the paths given.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from .style import mechanism_color, pyplot, save_figure

RUN_COLUMNS = (
    "run", "task", "mechanism", "steps", "test accuracy", "best valid", "majority",
    "time", "steps/s", "peak memory", "parameters", "device",
)  # fmt: skip


@dataclass
class Collected:
    """What :func:`collect` found: training runs (folder, results) and benchmark outputs."""

    runs: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    benchmarks: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)


def collect(paths: Iterable[str | Path]) -> Collected:
    """Every ``results.json`` and benchmark ``.json`` below ``paths`` (files or folders)."""
    found = Collected()
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such file or folder")
        files = [root] if root.is_file() else sorted(root.rglob("*.json"))
        for path in files:
            if path.resolve() in seen or path.suffix != ".json":
                continue
            seen.add(path.resolve())
            try:
                content = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ValueError(f"{path}: not a JSON file ({err})") from err
            if not isinstance(content, dict):
                continue
            if path.name == "results.json" and "test_accuracy" in content:
                found.runs.append((path.parent, content))
            elif "benchmark" in content:
                found.benchmarks.append((path, content))
    return found


def _percent(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "—"


def _mib(x: Any) -> str:
    return f"{x / 2**20:,.0f} MiB" if isinstance(x, (int, float)) else "—"


def _mechanism(results: dict[str, Any]) -> str:
    options = results.get("attention_options") or {}
    extra = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"`{results.get('mechanism', '?')}`" + (f" ({extra})" if extra else "")


def runs_table(runs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    """One row per run, grouped by task, best test accuracy first."""
    lines = ["| " + " | ".join(RUN_COLUMNS) + " |", "|---" * len(RUN_COLUMNS) + "|"]
    order = sorted(runs, key=lambda r: (r[1].get("task", ""), -r[1].get("test_accuracy", 0)))
    for folder, r in order:
        cells = [
            f"`{folder.name}`", str(r.get("task", "?")), _mechanism(r), f"{r.get('steps', '?')}",
            f"**{_percent(r.get('test_accuracy'))}**", _percent(r.get("best_valid_accuracy")),
            _percent(r.get("majority_baseline")), f"{r.get('wall_time_s', 0):.0f} s",
            f"{r.get('steps_per_s', 0):.1f}", _mib(r.get("peak_memory_bytes")),
            f"{r.get('num_parameters', 0):,}", str(r.get("device", "?")),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


LM_COLUMNS = (
    "run", "mechanism", "steps", "test bits/byte", "best valid bits/byte", "unigram bits/byte",
    "test perplexity", "time", "tokens/s", "peak memory", "parameters", "device",
)  # fmt: skip


def lm_table(runs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    """One row per language-model run, lowest test bits per byte first."""
    lines = ["| " + " | ".join(LM_COLUMNS) + " |", "|---" * len(LM_COLUMNS) + "|"]

    def num(x: Any, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, (int, float)) else "—"

    for folder, r in sorted(runs, key=lambda r: r[1].get("test_bits_per_byte", 0)):
        cells = [
            f"`{folder.name}`", _mechanism(r), f"{r.get('steps', '?')}",
            f"**{num(r.get('test_bits_per_byte'), '.3f')}**",
            num(r.get("best_valid_bits_per_byte"), ".3f"),
            num(r.get("unigram_bits_per_byte"), ".3f"), num(r.get("test_perplexity"), ".2f"),
            f"{r.get('wall_time_s', 0):.0f} s", num(r.get("tokens_per_s"), ",.0f"),
            _mib(r.get("peak_memory_bytes")), f"{r.get('num_parameters', 0):,}",
            str(r.get("device", "?")),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _validation_curve(folder: Path) -> list[tuple[int, float]]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("split") == "valid" and "accuracy" in record:
            points.append((int(record["step"]), float(record["accuracy"])))
    return points


def plot_runs(runs: Sequence[tuple[Path, dict[str, Any]]], path: Path) -> Path | None:
    """Validation accuracy against the step, one panel per task, one line per run."""
    curves = [(f, r, _validation_curve(f)) for f, r in runs]
    curves = [c for c in curves if c[2]]
    plt = pyplot() if curves else None
    if plt is None:
        return None
    tasks = sorted({r.get("task", "?") for _, r, _ in curves})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        drawn: dict[str, int] = {}  # runs of one mechanism share its colour, not its style
        for folder, r, points in curves:
            if r.get("task") == task:
                name = str(r.get("mechanism", "?"))
                n = drawn[name] = drawn.get(name, -1) + 1
                ax.plot(*zip(*points, strict=True), marker="os^vD"[n % 5], markersize=3,
                        linestyle=("-", "--", "-.", ":")[n % 4], color=mechanism_color(name),
                        label=f"{name} ({folder.name})")  # fmt: skip
        if any(r.get("task") == task and r.get("majority_baseline") for _, r, _ in curves):
            base = next(r["majority_baseline"] for _, r, _ in curves if r.get("task") == task)
            ax.axhline(base, color="grey", linestyle=":", label="majority class")
        ax.set_title(task)
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("validation accuracy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def _demote(markdown: str, source: Path, report_dir: Path) -> str:
    """A benchmark's markdown inside the report: headings one level down, image links made
    relative to the report."""
    text = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", markdown, flags=re.M)

    def relink(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("/"):
            return match.group(0)
        moved = os.path.relpath(source.parent / target, report_dir)
        return f"![{match.group(1)}]({Path(moved).as_posix()})"

    return re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", relink, text)


def benchmark_section(path: Path, content: dict[str, Any], report_dir: Path) -> str:
    """The benchmark's own markdown table (or a note when it is missing) and its plot."""
    table = path.with_suffix(".md")
    body = (
        _demote(table.read_text().strip(), table, report_dir)
        if table.exists()
        else f"## {content['benchmark']}\n\n(no table beside `{path.name}`)"
    )
    png = path.with_suffix(".png")
    if png.exists() and png.name not in body:
        link = Path(os.path.relpath(png, report_dir)).as_posix()
        body += f"\n\n![{content['benchmark']}]({link})"
    source = Path(os.path.relpath(path, report_dir)).as_posix()
    return f"{body}\n\nSource: `{source}`"


def build_report(paths: Sequence[str | Path], out: Path) -> str:
    """The markdown report of everything below ``paths``; plots are written beside ``out``."""
    found = collect(paths)
    if not found.runs and not found.benchmarks:
        raise ValueError(
            f"nothing to report under {', '.join(map(str, paths))}: no training run "
            "(results.json) and no benchmark output (.json with a 'benchmark' key)"
        )
    parts = [f"# kattn report\n\nGathered on {date.today().isoformat()} from "
             + ", ".join(f"`{p}`" for p in paths) + "."]  # fmt: skip
    lm = [(f, r) for f, r in found.runs if r.get("task") == "lm"]
    if lm:
        parts.append(
            "## Language-model runs\n\n" + lm_table(lm) + "\n\nBits per byte of the best "
            "checkpoint; the unigram baseline is the validation split under the training "
            "split's token frequencies."
        )
    found.runs = [(f, r) for f, r in found.runs if r.get("task") != "lm"]
    if found.runs:
        section = "## Training runs\n\n" + runs_table(found.runs)
        section += (
            "\n\nTime is the wall time of the whole run (evaluations included); peak memory "
            "is the CUDA allocator's peak on GPU and the process's peak resident memory on CPU."
        )
        png = plot_runs(found.runs, out.parent / f"{out.stem}-training.png")
        if png is not None:
            section += f"\n\n![validation accuracy against step]({png.name})"
        parts.append(section)
    for path, content in found.benchmarks:
        parts.append(benchmark_section(path, content, out.parent))
    return "\n\n".join(parts) + "\n"


def write_report(paths: Sequence[str | Path], out: Path) -> str:
    """:func:`build_report` of ``paths`` written to ``out`` (its folder made if missing);
    returns the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = build_report(paths, out)
    out.write_text(text)
    return text
