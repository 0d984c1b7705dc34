"""The targets and the markdown page of ``baselines_speed.py``."""

from __future__ import annotations

import math

SDPA = "sdpa"
REFORMER_PEER = "reformer-pytorch"
#: kattn's ``reformer`` with reformer-pytorch's number of buckets, L/m (the registered default
#: is the paper's 2L/m, twice the hashing work): the like-for-like row beside the peer
REFORMER_MATCHED = "reformer nb=L/m"


def _at(report: dict, key: str, length: str, row: str) -> float | None:
    return report[key].get(length, {}).get(row)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def memory_exponents(report: dict) -> dict[str, float]:
    """Per row, the exponent p of the forward + backward peak memory ~ L^p between the two
    longest lengths where the row ran (1: linear, 2: quadratic)."""
    mem = report["train_memory"]
    found = {}
    for row in report["rows"]:
        ran = [n for n in mem if row in mem[n]]
        if len(ran) >= 2:
            a, b = sorted(ran, key=int)[-2:]
            found[row] = math.log(mem[b][row] / mem[a][row]) / math.log(int(b) / int(a))
    return found


def targets(report: dict) -> list[dict]:
    """The issue's targets, each with its measured value and whether it holds."""
    train, memory = "train_seconds", "train_memory"
    lengths = sorted(report[train], key=int)
    dense = [n for n in lengths if SDPA in report[train][n]]
    found = []
    if dense:
        n = dense[-1]
        speedup = _ratio(_at(report, train, n, SDPA), _at(report, train, n, "reformer"))
        found.append(
            _target(f"reformer forward+backward speed-up over SDPA at L={n}", speedup, low=1.0)
        )
    n = lengths[-1]
    for row, label in (
        ("reformer", "reformer"),
        (REFORMER_MATCHED, "reformer, nb = L/m as the peer"),
    ):
        for what, key in (("time", train), ("peak memory", memory)):
            ratio = _ratio(_at(report, key, n, row), _at(report, key, n, REFORMER_PEER))
            name = f"{label} / reformer-pytorch forward+backward {what} at L={n}"
            found.append(_target(name, ratio, high=0.5))
    gate = [
        _ratio(_at(report, train, m, "rfa_gate causal"), _at(report, train, m, "rfa causal"))
        for m in lengths
    ]
    known = [g for g in gate if g is not None]
    name = "rfa_gate / rfa causal forward+backward time, worst length"
    found.append(_target(name, max(known) if known else None, high=1.5))
    others = (SDPA, "synthesizer", REFORMER_PEER, "sinkhorn-transformer")
    exponents = [p for r, p in memory_exponents(report).items() if r not in others]
    name = "largest memory growth exponent of kattn's rows but synthesizer (quadratic: 2)"
    found.append(_target(name, max(exponents) if exponents else None, high=1.5))
    return found


def _target(name: str, value: float | None, low: float | None = None, high: float | None = None):
    met = value is not None and (low is None or value >= low) and (high is None or value <= high)
    return {"name": name, "value": value, "min": low, "max": high, "met": met}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = 1000 * seconds
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _table(report: dict, key: str, title: str) -> list[str]:
    rows = report["rows"]
    lines = [f"### {title}", "", "| L | " + " | ".join(rows) + " |",
             "|---|" + "---|" * len(rows)]  # fmt: skip
    for n, times in report[f"{key}_seconds"].items():
        memory = report[f"{key}_memory"][n]
        cells = []
        for row in rows:
            if row not in times:
                cells.append("—")
                continue
            speedup = _ratio(times.get(SDPA), times[row])
            ratio = f" ({speedup:.2f}×)" if speedup and row != SDPA else ""
            cells.append(f"{_ms(times[row])}{ratio}, {memory[row] / 2**20:,.0f} MiB")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render(report: dict) -> str:
    info, cfg = report["machine"], report["config"]
    threads = info.get("torch_threads")
    lines = [
        "# Content-based and learned baselines against dense softmax and the peer packages "
        "on the CPU",
        "",
        f"{info['processor']}, {threads} torch thread{'s' if threads != 1 else ''} of "
        f"{info.get('cpu_count')} cores; torch {info['torch']}, kattn {info['kattn']}, Python "
        f"{info['python']}. Load average (1 min) {report['load_average']['start'][0]:.2f} at "
        f"the start, {report['load_average']['end'][0]:.2f} at the end.",
        f"B={cfg['batch']}, H={cfg['heads']}, D=Dv={cfg['head_dim']}, fp32, registered "
        "defaults; `… causal` rows are called with causal=True, the others without. Each cell: "
        f"median over interleaved rounds ({cfg['rounds']}) of the median of the calls in a "
        "round, in ms; (×) the speed-up over SDPA in the same run; peak memory of the tensors "
        "allocated during one call (PyTorch profiler allocation records; q, k, v made before "
        "excluded). `—`: not run (see the notes).",
        "",
        *_table(report, "forward", "Forward"),
        *_table(report, "train", "Forward + backward"),
        "### Memory growth",
        "",
        "Exponent p of the forward + backward peak memory, peak ~ L^p between the two longest "
        "lengths each row ran at (1 linear, 2 quadratic).",
        "",
        "| row | p |",
        "|---|---|",
        *(f"| {row} | {p:.2f} |" for row, p in memory_exponents(report).items()),
        "",
        "## Targets",
        "",
        "| target | measured | goal | met |",
        "|---|---|---|---|",
    ]
    for t in report["targets"]:
        goal = f"≥ {t['min']:g}" if t["min"] is not None else f"≤ {t['max']:g}"
        value = "not run" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['name']} | {value} | {goal} | {'yes' if t['met'] else 'no'} |")
    checks = ", ".join(f"{r} {e:.1e}" for r, e in report["correctness"].items())
    lines += ["", f"Checked first against the dense references (max abs difference, both in "
              f"float64): {checks}.", "", "## Notes", ""]  # fmt: skip
    lines += [f"- {note}" for note in report["notes"]] or ["- none"]
    return "\n".join(lines) + "\n"
