"""Renderers of the generated parts of docs/sparse.md: the speed and memory of the
structured-sparse mechanisms (``benchmarks/sparse_speed.py``) and their ListOps runs."""

from __future__ import annotations

from .sources import mib

#: the columns of the speed result, with the options each ran with
SPARSE_ROWS = (
    ("sdpa", "SDPA (dense softmax)"),
    ("local", "`local` (window 256)"),
    ("local blocked", "`local`, blocked (blocks of 128)"),
    ("longformer", "`longformer` (window 512, 1 global)"),
    ("bigbird", "`bigbird` (block 64, 3 random blocks)"),
    ("sparse_transformer", "`sparse_transformer` (strided, 128)"),
)


def _ms(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _sci(value: float) -> str:
    """``6e-7`` rather than Python's ``6e-07``."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _ratio(value: float) -> str:
    return f"{value:.1f}×"


def sparse_speed(d: dict, length: str = "16384") -> str:
    """The table at one length (speed-ups over SDPA in the same run) and the bullets on
    memory, the FLOP bound, decoding and the side-by-side with lucidrains' package."""
    fwd, train, mem = d["forward_seconds"], d["train_seconds"], d["forward_memory"]
    threads = d["machine"]["torch_threads"]
    lines = [
        f"At L = {int(length):,}, {threads} torch thread{'s' if threads > 1 else ''}:",
        "",
        "| mechanism | forward (ms) | speed-up over SDPA | forward + backward (ms) | speed-up "
        "| peak memory, forward |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in SPARSE_ROWS:
        f, t = fwd[length][key], train[length][key]
        lines.append(
            f"| {label} | {_ms(f)} | {_ratio(fwd[length]['sdpa'] / f)} | {_ms(t)} | "
            f"{_ratio(train[length]['sdpa'] / t)} | {mib(mem[length][key]):,.0f} MiB |"
        )
    lengths = [n for n in d["forward_memory"] if "local" in d["forward_memory"][n]]
    local_peaks = ", ".join(f"{mib(mem[n]['local']):,.0f}" for n in lengths)
    bound = d["local_bound"]
    ratios = [bound[n]["ratio"] for n in bound]
    decode = {(r["mechanism"], r["context"]): r for r in d["decode"]}
    contexts = sorted(c for m, c in decode if m == "local")
    short, long = contexts[0], contexts[-1]
    flat = decode["local", long]["step_seconds"] / decode["local", short]["step_seconds"]
    side = d["side_by_side"]
    diff = max(r["max_abs_diff"] for r in side)
    side_ratios = [r["kattn_forward"] / r["lucidrains_forward"] for r in side]
    lines += [
        "",
        f"- Memory grows linearly: `local` peaks at {local_peaks} MiB at L = "
        + ", ".join(f"{int(n):,}" for n in lengths)
        + " (SDPA's scores at the longest length would not fit the benchmark's memory cap).",
        f"- `local` runs at {min(ratios):.1f}–{max(ratios):.1f}× the FLOP lower bound of its "
        "band (its q·k and weighted sum at the machine's measured matmul throughput) over "
        "these lengths; the gap is the softmax, the gathering of key blocks and the keys that "
        "the 64-token blocks read beyond a 256-key window.",
        f"- Decoding with `local` costs the same per token at a context of {short:,} and of "
        f"{long:,} ({flat:.2f}×); softmax decoding grows from "
        f"{1e6 * decode['softmax', short]['step_seconds']:,.0f} µs to "
        f"{1e6 * decode['softmax', long]['step_seconds']:,.0f} µs per token over the same "
        "range.",
        f"- The blocked `local` equals lucidrains' `local-attention` {d['side_by_side_version']} "
        f"to {_sci(diff)} on the same inputs and takes {min(side_ratios):.2f}–"
        f"{max(side_ratios):.2f}× its time forward (L = "
        + ", ".join(f"{n:,}" for n in sorted({r["length"] for r in side}))
        + ", causal and not).",
    ]
    return "\n".join(lines)


#: the ListOps runs of docs/sparse.md: (mechanism, options as given on the command line)
SPARSE_LISTOPS = (
    ("softmax", ""),
    ("local", "`window=16`"),
    ("longformer", "`window=16` (1 global token)"),
    ("bigbird", "`block_size=8` (3 window, 3 random blocks, 16 global tokens)"),
    ("sparse_transformer", "`stride=8` (strided, union)"),
)


def sparse_listops(*runs: dict) -> str:
    """One row per run (its results.json): accuracies, the majority baseline, wall time."""
    lines = [
        "| mechanism | options | test accuracy | best valid | majority baseline | time |",
        "|---|---|---|---|---|---|",
    ]
    for (name, options), run in zip(SPARSE_LISTOPS, runs, strict=True):
        assert run["mechanism"] == name, (run["mechanism"], name)
        lines.append(
            f"| `{name}` | {options} | {100 * run['test_accuracy']:.1f}% | "
            f"{100 * run['best_valid_accuracy']:.1f}% | {100 * run['majority_baseline']:.1f}% "
            f"| {run['wall_time_s']:,.0f} s |"
        )
    return "\n".join(lines)
