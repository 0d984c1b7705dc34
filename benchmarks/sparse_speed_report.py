"""Pure parts of ``benchmarks/sparse_speed.py``: the FLOP lower bound of a band, the memory
cap that decides where the dense baseline runs, the targets, and the markdown tables.

Imported by ``sparse_speed.py``, which Python runs with this folder on its path.
"""

from __future__ import annotations

import statistics

#: the dense baseline's row name (PyTorch's fused ``scaled_dot_product_attention``).
SDPA = "sdpa"
#: the issue's targets: forward speed-ups over SDPA at this length, the local band's time
#: against its FLOP bound, and the decoding time per token from the shortest to the longest
#: context.
TARGET_LENGTH = 16384
TARGET_SPEEDUP = {"local": 15.0, "bigbird": 5.0, "longformer": 5.0}
TARGET_BOUND_RATIO = 3.0
TARGET_DECODE_RATIO = 1.3


def band_keys(length: int, look_backward: int, look_forward: int, causal: bool = False) -> int:
    """``Σ_i |band(i)|``: the (query, key) pairs of the band ``i − look_backward ≤ j ≤ i +
    look_forward`` (``j ≤ i`` as well when causal) over ``0 ≤ i, j < length``: query i reads
    ``min(i + fwd, L − 1) − max(i − back, 0) + 1`` keys (fwd = 0 when causal).
    """
    fwd = 0 if causal else look_forward
    total = 0
    for i in range(length):
        total += min(i + fwd, length - 1) - max(i - look_backward, 0) + 1
    return total


def band_flops(pairs: int, batch: int, heads: int, head_dim: int, value_dim: int) -> int:
    """Forward FLOPs of softmax attention restricted to ``pairs`` (query, key) pairs per head:
    ``2·B·H·pairs·(D + Dv)`` (one multiply-add per element of q·k and of the weighted sum of v;
    the softmax itself is not counted, so this is a lower bound)."""
    return 2 * batch * heads * pairs * (head_dim + value_dim)


def score_bytes(length: int, batch: int, heads: int, itemsize: int = 4) -> int:
    """Bytes of the ``(B, H, L, L)`` score matrix of dense attention."""
    return batch * heads * length * length * itemsize


def dense_fits(length: int, batch: int, heads: int, cap_bytes: float) -> bool:
    """Whether dense attention at ``length`` runs: its ``(B, H, L, L)`` fp32 scores (the work
    it does, even where a fused kernel never stores them at once) fit under ``cap_bytes``."""
    return score_bytes(length, batch, heads) <= cap_bytes


def speedups(seconds: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Per length, each row's speed-up over :data:`SDPA` (its time over the row's); None where
    either was not measured."""
    out: dict[str, dict[str, float | None]] = {}
    for length, row in seconds.items():
        base = row.get(SDPA)
        out[length] = {
            name: (base / t if base and t else None) for name, t in row.items() if name != SDPA
        }
    return out


def targets(report: dict) -> list[dict]:
    """The issue's targets, each with the measured value and whether it is met (None: not
    measured in this run)."""
    out = []
    key = str(TARGET_LENGTH)
    forward = speedups(report["forward_seconds"]).get(key, {})
    for name, goal in TARGET_SPEEDUP.items():
        value = forward.get(name)
        out.append(_target(f"{name} forward speed-up over SDPA at L={key}", value, low=goal))
    bound = report.get("local_bound", {}).get(key)
    value = bound["ratio"] if bound else None
    out.append(
        _target(f"local forward time / FLOP bound at L={key}", value, high=TARGET_BOUND_RATIO)
    )
    ratio = decode_ratio(report.get("decode", []), "local")
    out.append(
        _target(
            "local decoding: time per token, longest / shortest context",
            ratio,
            high=TARGET_DECODE_RATIO,
        )
    )
    return out


def _target(name: str, value: float | None, low: float | None = None, high: float | None = None):
    met = None
    if value is not None:
        met = (low is None or value >= low) and (high is None or value <= high)
    return {"name": name, "value": value, "min": low, "max": high, "met": met}


def decode_ratio(rows: list[dict], mechanism: str) -> float | None:
    """Time per token at the longest context over the shortest, for ``mechanism``."""
    mine = sorted((r for r in rows if r["mechanism"] == mechanism), key=lambda r: r["context"])
    if len(mine) < 2:
        return None
    return mine[-1]["step_seconds"] / mine[0]["step_seconds"]


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.1f}"


def _times_table(seconds: dict, memory: dict, title: str) -> list[str]:
    names = list(dict.fromkeys(n for row in seconds.values() for n in row))
    ups = speedups(seconds)
    lines = [f"### {title}", "", "| L | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for length, row in seconds.items():
        cells = []
        for name in names:
            t, up = row.get(name), ups[length].get(name)
            cell = _ms(t) + (f" ({up:.1f}×)" if up else "")
            if name in memory.get(length, {}) and memory[length][name] is not None:
                cell += f", {memory[length][name] / 2**20:.1f} MiB"
            cells.append(cell)
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render(report: dict) -> str:
    """The markdown page of one run."""
    info, cfg = report["machine"], report["config"]
    lines = [
        "# Structured-sparse attention against dense softmax on the CPU",
        "",
        f"{info['processor']}, {_threads(info)}; torch {info['torch']}, kattn "
        f"{info['kattn']}, Python {info['python']}. Load average (1 min) "
        f"{report['load_average']['start'][0]:.2f} at the start, "
        f"{report['load_average']['end'][0]:.2f} at the end (a shared machine: medians).",
        f"B={cfg['batch']}, H={cfg['heads']}, D=Dv={cfg['head_dim']}, fp32, non-causal. "
        f"Each cell: median over interleaved rounds ({cfg['rounds']}) of the median of the "
        "calls in a round, in ms; (×) the speed-up over SDPA in the same run; peak memory of "
        "the tensors allocated during one call (PyTorch profiler's allocation records on the "
        "CPU; q, k, v made before excluded). `—`: not run (see the notes).",
        "",
        *_times_table(report["forward_seconds"], report["forward_memory"], "Forward"),
        *_times_table(report["train_seconds"], report["train_memory"], "Forward + backward"),
    ]
    lines += _bound_lines(report)
    lines += _decode_lines(report)
    lines += _side_by_side_lines(report)
    lines += ["## Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in report["targets"]:
        goal = f"≥ {t['min']:g}×" if t["min"] is not None else f"≤ {t['max']:g}×"
        value = "not measured" if t["value"] is None else f"{t['value']:.2f}×"
        met = {None: "—", True: "yes", False: "NO"}[t["met"]]
        lines.append(f"| {t['name']} | {value} | {goal} | {met} |")
    errors = ", ".join(f"{k} {v:.1e}" for k, v in report["correctness"].items())
    lines += [
        "",
        f"Checked first against the dense references (max abs difference, "
        f"L={report['correctness_length']}): {errors}.",
        "",
        "## Notes",
        "",
    ]
    lines += [f"- {note}" for note in report["notes"]] or ["- every row ran at every length."]
    return "\n".join([*lines, ""])


def _threads(info: dict) -> str:
    """The torch thread count, and why when it is below the core count (``--threads``)."""
    threads, cores = info["torch_threads"], info["cpu_count"]
    if threads >= cores:
        return f"{threads} threads"
    return (
        f"{threads} torch thread{'s' if threads > 1 else ''} of {cores} cores (`--threads`: on "
        "a machine shared with other jobs, multi-threaded runs of many small kernels stall at "
        "every parallel region while a thread waits to be scheduled, and the sparse rows "
        "would time the scheduler; every row runs with the same threads)"
    )


def _bound_lines(report: dict) -> list[str]:
    size = report["matmul_size"]
    lines = [
        "## `local` against its FLOP lower bound",
        "",
        "Bound = 2·B·H·Σ_i|band(i)|·(D + Dv) FLOPs (the band's q·k and weighted sum of v, "
        "softmax not counted) at the machine's fp32 matmul throughput, measured as a "
        f"{size}×{size} by {size}×{size} `torch.matmul` (2·{size}³ FLOPs) timed in the same "
        "interleaved rounds as the forward passes at that length.",
        "",
        "| L | band pairs per head | GFLOP | matmul GFLOP/s | bound (ms) | forward (ms) "
        "| forward / bound | per-round range |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for length, row in report["local_bound"].items():
        ratios = row["round_ratios"]
        lines.append(
            f"| {length} | {row['pairs']} | {row['flops'] / 1e9:.2f} | {row['gflops']:.0f} | "
            f"{row['bound_seconds'] * 1e3:.1f} | {row['seconds'] * 1e3:.1f} | "
            f"{row['ratio']:.1f}× | {min(ratios):.1f}–{max(ratios):.1f}× |"
        )
    return [*lines, ""]


def _decode_lines(report: dict) -> list[str]:
    rows = report.get("decode", [])
    if not rows:
        return []
    cfg = report["config"]
    lines = [
        "## Decoding (causal)",
        "",
        f"Time per token of `step` (B=1, H={cfg['heads']}, D={cfg['head_dim']}) after a "
        f"context read by `prefill` (timed once, not counted); median over "
        f"{cfg['decode_rounds']} rounds (each over every context) of the median of "
        f"{cfg['decode_steps']} steps, `torch.inference_mode()`.",
        "",
        "| mechanism | context | µs/token | / shortest context | per-round range | prefill (s) |",
        "|---|---|---|---|---|---|",
    ]
    first: dict[str, float] = {}
    for r in rows:
        base = first.setdefault(r["mechanism"], r["step_seconds"])
        per_round = r.get("round_ratio_to_shortest") or [r["step_seconds"] / base]
        lines.append(
            f"| {r['mechanism']} | {r['context']} | {r['step_seconds'] * 1e6:.0f} | "
            f"{r['step_seconds'] / base:.2f}× | {min(per_round):.2f}–{max(per_round):.2f}× | "
            f"{r['prefill_seconds']:.2f} |"
        )
    return [*lines, ""]


def _side_by_side_lines(report: dict) -> list[str]:
    rows = report.get("side_by_side", [])
    if not rows:
        return []
    lines = [
        "## Side by side with lucidrains `local-attention`",
        "",
        f"`local_attention.LocalAttention` {report['side_by_side_version']} (no rotary, no "
        'xpos) against kattn `local` with `variant="blocked"` and the same window and '
        "look-back/look-forward blocks, on the same q, k, v: max abs difference of the "
        "outputs, and times (ms, medians of interleaved rounds).",
        "",
        "| L | causal | max abs diff | kattn fwd | lucidrains fwd | kattn / lucidrains "
        "| kattn fwd+bwd | lucidrains fwd+bwd | kattn / lucidrains |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']} | {r['causal']} | {r['max_abs_diff']:.1e} | "
            f"{_ms(r['kattn_forward'])} | {_ms(r['lucidrains_forward'])} | "
            f"{r['kattn_forward'] / r['lucidrains_forward']:.2f}× | "
            f"{_ms(r['kattn_train'])} | {_ms(r['lucidrains_train'])} | "
            f"{r['kattn_train'] / r['lucidrains_train']:.2f}× |"
        )
    return [*lines, ""]


def median_of_rounds(per_round: list[float]) -> float:
    """The reported time: the median of the per-round medians."""
    return statistics.median(per_round)
