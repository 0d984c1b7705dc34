"""Renderers of the generated tables of docs/nystrom.md: speed, spectral error, stability and
the Newton-Schulz start of the pseudo-inverse."""

from __future__ import annotations

import statistics

from .sources import mib
from .tables import sig3

NYSTROM_NAMES = ("softmax", "softmax (materialised)", "skyformer", "nystromformer", "linformer",
                 "performer")  # fmt: skip


def _one_decimal(value: float) -> str:
    """One decimal below 100, none (with a thousands separator) from 100 on."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def nystrom_speed(d: dict) -> str:
    lines = [
        "| L | softmax | materialised | skyformer | nystromformer | linformer | performer |",
        "|---|---|---|---|---|---|---|",
    ]
    for length, seconds in d["seconds"].items():
        cells = [f"{_one_decimal(1000 * seconds[n])} ms" for n in NYSTROM_NAMES]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    peaks = d["peak_memory_bytes"]["4096"]
    cells = [_one_decimal(mib(peaks[n])) for n in NYSTROM_NAMES]
    lines.append("| peak MiB at 4096 | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SPECTRAL_LABELS = {"skyformer": "skyformer vs gaussian",
                   "nystromformer": "nystromformer vs softmax",
                   "performer": "performer vs softmax",
                   "linformer": "linformer vs softmax (untrained)"}  # fmt: skip


def spectral_table(rows: list[dict], length: int = 1024) -> str:
    mine = [r for r in rows if r["length"] == length]
    features = sorted({r["features"] for r in mine})
    error = {(r["mechanism"], r["features"]): r["rel_error"] for r in mine}
    lines = ["| m | " + " | ".join(map(str, features)) + " |", "|---|" + "---|" * len(features)]
    for name, label in SPECTRAL_LABELS.items():
        lines.append(f"| {label} | " + " | ".join(sig3(error[name, m]) for m in features) + " |")
    return "\n".join(lines)


#: the instability scores of Chen et al. 2021, Appendix F, Table 3, over the LRA tasks
STABILITY_PAPER = {"nystromformer": "0.97–1.03", "gaussian": "0.62–0.83", "skyformer": "0.64–0.81"}


def seed_means(d: dict, name: str) -> list[float]:
    """The mean ratio to softmax over the steps of each seed (as kattn.bench.stability)."""
    seeds: dict[int, list[float]] = {}
    for row in d["rows"]:
        if row["mechanism"] == name:
            seeds.setdefault(row["seed"], []).append(row["ratio"])
    return [statistics.mean(seeds[s]) for s in sorted(seeds)]


def stability_table(d: dict) -> str:
    lines = ["| mechanism | τ ratio to softmax | paper (LRA tasks) |", "|---|---|---|"]
    for name, paper in STABILITY_PAPER.items():
        per_seed = seed_means(d, name)
        mean, spread = statistics.mean(per_seed), statistics.stdev(per_seed)
        lines.append(f"| {name} | {mean:.3f} ± {spread:.3f} | {paper} |")
    return "\n".join(lines)


def _small(value: float) -> str:
    """Three significant digits from 0.01 on, two below, an exponent at rounding level."""
    if value < 1e-6:
        return f"{value:.1e}"
    return f"{value:#.3g}" if value >= 0.01 else f"{value:#.2g}"


def pinv_approximation(d: dict) -> str:
    lines = [
        "| L | start | inverse | output vs `gaussian` | output vs exact inverse |",
        "|---|---|---|---|---|",
    ]
    for r in d["approximation"]:
        if r["init"] != "exact inverse":
            lines.append(
                f"| {r['length']} | {r['init']} | {_small(r['inverse'])} | "
                f"{r['vs_gaussian']:.4f} | {_small(r['vs_exact_inverse'])} |"
            )
    return "\n".join(lines)


def pinv_training(d: dict) -> str:
    lines = [
        "| start | non-finite steps | gradient norm, median / max | loss, last 20 steps "
        "| held-out accuracy | τ / τ(softmax) |",
        "|---|---|---|---|---|---|",
    ]
    for init, s in d["training"]["summary"].items():
        lines.append(
            f"| {init} | {s['non_finite_steps']} | {s['median_grad_norm']:.2f} / "
            f"{s['max_grad_norm']:.2f} | {s['final_loss']:.3f} | {s['accuracy']:.3f} | "
            f"{s['tau_ratio_to_softmax']:.3f} |"
        )
    return "\n".join(lines)
