"""What a study (:mod:`kattn.train.studies`) writes besides its runs: per-cell means with 95%
confidence intervals over seeds (Student's t), the markdown tables and the PNG figure.

A study's records are one per (row, column, seed): a row is a trained variant (a mechanism,
a feature map dimension, a feature map), a column how it was evaluated (``oracle`` or a
conversion with M features, or ``trained``); each record holds the validation ``bleu`` and
``loss``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: t_{0.975, df} for df = 1 … 30 (two-sided 95%).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964
#: the metrics a study reports: key → (heading, decimals).
METRICS = {"bleu": ("validation BLEU", 2), "loss": ("validation loss (nats per token)", 3)}


def t_quantile_975(df: int) -> float:
    """Student's t quantile at 0.975 with ``df`` degrees of freedom (a table to 30, then the
    Cornish–Fisher expansion, within 1e-3 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and the half-width of its 95% confidence interval,
    ``t_{0.975, n−1} · s / √n`` (s the sample standard deviation); None for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile_975(n - 1) * s / math.sqrt(n)


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """metric → ``"row|column"`` → mean, ci95, n and the per-seed values (finite values
    only: a diverged loss is left out of the mean and counted in ``missing``)."""
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for metric in METRICS:
        cells: dict[str, list[Any]] = {}
        for record in records:
            cells.setdefault(f"{record['row']}|{record['column']}", []).append(record[metric])
        summary[metric] = {}
        for cell, values in cells.items():
            finite = [float(v) for v in values if v is not None and math.isfinite(v)]
            mean, ci = mean_ci(finite) if finite else (None, None)
            summary[metric][cell] = {
                "mean": mean, "ci95": ci, "n": len(finite), "missing": len(values) - len(finite),
                "values": values,
            }  # fmt: skip
    return summary


def _cell(entry: dict[str, Any] | None, decimals: int) -> str:
    if entry is None or entry["mean"] is None:
        return "–"
    text = f"{entry['mean']:.{decimals}f}"
    if entry["ci95"] is not None:
        text += f" ± {entry['ci95']:.{decimals}f}"
    return text + (f" ({entry['missing']} diverged)" if entry["missing"] else "")


def markdown(study: dict[str, Any]) -> str:
    """The study's tables (one per metric: rows × columns, mean ± 95% interval over seeds)."""
    rows, columns = study["rows"], study["columns"]
    settings = study["settings"]
    decoding = "greedy" if settings["beam"] == 1 else f"beam {settings['beam']}"
    lines = [
        f"# Study {study['study']}: {study['title']}",
        "",
        f"{study['reference']}. {study['description']}",
        "",
        f"Mean ± 95% confidence interval (Student's t) over {settings['seeds']} seed(s) per "
        f"cell; BLEU of the first {settings['bleu_examples']} validation pairs, {decoding} "
        f"decoding; loss over the whole validation split. Preset {settings['preset']}, "
        f"{settings['steps'] or 'the preset’s'} steps, data "
        f"{settings['data'] or 'embedded (gettext catalogues)'}"
        + (f", overrides {', '.join(settings['overrides'])}" if settings["overrides"] else "")
        + ".",
    ]
    for metric, (heading, decimals) in METRICS.items():
        head = [study["row_heading"], *(c["label"] for c in columns)]
        lines += ["", f"## {heading[0].upper()}{heading[1:]}", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in rows:
            cells = [
                _cell(study["summary"][metric].get(f"{row['key']}|{c['key']}"), decimals)
                for c in columns
            ]
            lines.append("| " + " | ".join([row["label"], *cells]) + " |")
    return "\n".join(lines) + "\n"


def plot(study: dict[str, Any], path: Path) -> Path | None:
    """Bars of validation BLEU with 95% intervals: one panel per row with a bar per column
    (the conversion study, as Luo et al.'s Figure 2), or one panel with a bar per row (a
    single column: Figure 3). None, with a warning, when matplotlib is missing."""
    from ..bench.style import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    rows, columns = study["rows"], study["columns"]
    cells = study["summary"]["bleu"]
    panels = (
        [(row["label"], [(c["label"], cells.get(f"{row['key']}|{c['key']}")) for c in columns])
         for row in rows]
        if len(columns) > 1
        else [(columns[0]["label"], [(r["label"], cells.get(f"{r['key']}|{columns[0]['key']}"))
                                      for r in rows])]
    )  # fmt: skip
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels) + 1, 3.2), squeeze=False, sharey=True
    )
    for ax, (title, bars) in zip(axes[0], panels, strict=True):
        means = [b["mean"] if b and b["mean"] is not None else 0.0 for _, b in bars]
        errors = [b["ci95"] if b and b["ci95"] is not None else 0.0 for _, b in bars]
        colours = ["#7f7f7f" if label == "Oracle" else "#2ca02c" for label, _ in bars]
        ax.bar(range(len(bars)), means, yerr=errors, color=colours, capsize=3)
        ax.set_xticks(range(len(bars)), [label for label, _ in bars], rotation=30, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("validation BLEU", fontsize=8)
        ax.set_ylim(bottom=0.0)  # BLEU ≥ 0; a 2-seed interval may reach below
    caption = f"{study['reference']}: {study['title']} (mean ± 95% CI over seeds)."
    return save_figure(fig, path, caption)
