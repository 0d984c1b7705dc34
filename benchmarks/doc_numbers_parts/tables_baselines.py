"""Renderers of the generated parts of docs/baselines.md: the speed and memory of the
content-based and learned baselines (``benchmarks/baselines_speed.py``) and their ListOps runs
beside the papers' reported ListOps numbers."""

from __future__ import annotations

from kattn.papers import reported_listops

from .sources import mib

#: the ListOps runs of docs/baselines.md: (mechanism, options as given on the command line)
BASELINE_LISTOPS = (
    ("reformer", "`bucket_size=16`"),
    ("smyrf", "`cluster_size=16`"),
    ("clustered", "`num_clusters=10`"),
    ("improved_clustered", "`num_clusters=10`, `topk=16`"),
    ("sinkhorn", "`block_size=16`"),
    ("synthesizer", ""),
    ("informer", "`factor=2`"),
    ("rfa_gate", "`num_features=64`"),
)


def _ms(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def baselines_speed(d: dict) -> str:
    """Forward + backward at every length: time, speed-up over SDPA, peak memory; then the
    targets of the run."""
    train, memory = d["train_seconds"], d["train_memory"]
    lengths = sorted(train, key=int)
    threads = d["machine"]["torch_threads"]
    lines = [
        f"Forward + backward, {threads} torch thread{'s' if threads > 1 else ''}: time in ms "
        "(speed-up over SDPA in the same run), peak memory in MiB; `—`: not run (the "
        "L × L scores of SDPA or `synthesizer` over the run's caps).",
        "",
        "| mechanism | " + " | ".join(f"L = {int(n):,}" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for row in d["rows"]:
        cells = []
        for n in lengths:
            if row not in train[n]:
                cells.append("—")
                continue
            sdpa = train[n].get("sdpa")
            ratio = f" ({sdpa / train[n][row]:.1f}×)" if sdpa and row != "sdpa" else ""
            cells.append(f"{_ms(train[n][row])}{ratio}, {mib(memory[n][row]):,.0f} MiB")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in d["targets"]:
        goal = f"≥ {t['min']:g}" if t["min"] is not None else f"≤ {t['max']:g}"
        value = "not run" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['name']} | {value} | {goal} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines)


def baselines_listops(*runs: dict) -> str:
    """One row per run (its results.json), with the ListOps accuracies the papers report for
    the same system (Long Range Arena ListOps, length 2K, full training: not comparable with
    these short runs, given for orientation)."""
    lines = [
        "| mechanism | options | test accuracy | best valid | majority baseline | time "
        "| the papers' LRA ListOps |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, options), run in zip(BASELINE_LISTOPS, runs, strict=True):
        assert run["mechanism"] == name, (run["mechanism"], name)
        papers = "; ".join(f"{value:.2f}% ({where})" for where, value in reported_listops(name))
        lines.append(
            f"| `{name}` | {options} | {100 * run['test_accuracy']:.1f}% | "
            f"{100 * run['best_valid_accuracy']:.1f}% | {100 * run['majority_baseline']:.1f}% "
            f"| {run['wall_time_s']:,.0f} s | {papers or '—'} |"
        )
    return "\n".join(lines)
