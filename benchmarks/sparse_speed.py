"""Speed and peak memory of the structured-sparse mechanisms against dense softmax on the CPU.

One run on one machine: B=1, H=4, D=Dv=64, fp32, non-causal, L = 1K, 4K, 16K, 64K.

* Rows: the dense baseline ``sdpa`` (PyTorch's fused ``scaled_dot_product_attention``, run
  only where its ``(B, H, L, L)`` fp32 scores fit under ``--memory-cap-gb``: the fused kernel
  never stores them at once, but its time grows with them); kattn's ``softmax`` (the same
  kernel through the module, up to ``--softmax-max-length``); ``local`` with window 256 (the
  exact band); ``local`` blocked (``variant="blocked"``, window 128) once that option exists;
  ``longformer``, ``bigbird`` (block 64, 3 random blocks, as the issue fixes) and
  ``sparse_transformer`` with their registered defaults once they are registered. Every
  mechanism is built by ``kattn.build(name, head_dim=64, num_heads=4, max_len=L, ...)`` and
  checked against its dense reference first.
* Forward (``torch.no_grad()``) and forward + backward: the median over interleaved rounds of
  the median of the calls in each round; peak memory of one call (the PyTorch profiler's
  allocation records on the CPU: the peak of the running total of tensor bytes allocated
  during the call, the inputs made before excluded), which is also the warm-up call.
* ``local``'s forward against its FLOP lower bound ``2·B·H·Σ_i|band(i)|·(D + Dv)`` at the fp32
  throughput of a ``--matmul-size`` square ``torch.matmul`` timed in the same rounds.
* Decoding (``sparse_speed_decode.py``): time per token of ``local`` and ``softmax`` steps
  after contexts 512–32K, and ``local`` blocked beside lucidrains' ``local-attention``
  (optional: ``--local-attention-path`` puts a folder where it is installed on the path).

Results go to ``benchmarks/results/sparse-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/sparse_speed.py --local-attention-path /tmp/la_pkgs   # the committed run
    python benchmarks/sparse_speed.py --quick                              # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kattn
from kattn.bench import machine_info, measure_time, peak_memory_bytes
from kattn.bench.script_results import write_run
from kattn.functional.softmax import softmax_attention_reference
from kattn.registry import MECHANISMS
from sparse_speed_decode import measure_decoding, side_by_side
from sparse_speed_report import (
    SDPA,
    band_flops,
    band_keys,
    dense_fits,
    median_of_rounds,
    render,
    score_bytes,
    targets,
)

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D = 1, 4, 64
WINDOW, BLOCKED_WINDOW = 256, 128
MATMUL = "fp32 matmul"
SPARSE = ("longformer", "bigbird", "sparse_transformer")
#: options the issue fixes; the rest are each mechanism's registered defaults.
ISSUE_OPTIONS: dict[str, dict[str, Any]] = {
    "local": {"window": WINDOW},
    "local blocked": {"window": BLOCKED_WINDOW, "variant": "blocked"},
    "bigbird": {"block_size": 64, "num_random_blocks": 3},
}


class Dense(torch.nn.Module):
    """The baseline: ``scaled_dot_product_attention(q, k, v)``."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def has_blocked_variant() -> bool:
    """Whether ``local`` takes ``variant`` (the blocked form of the LRA code)."""
    return "variant" in (MECHANISMS.option_names("local") or [])


def sparse_names(notes: list[str]) -> list[str]:
    """The sparse rows that can run now; a note for each that cannot."""
    names = ["local"]
    if has_blocked_variant():
        names.append("local blocked")
    else:
        notes.append("`local` blocked: `local` has no `variant` option yet, row skipped.")
    for name in SPARSE:
        if name in kattn.available():
            names.append(name)
        else:
            notes.append(f"`{name}`: not registered yet, row skipped.")
    return names


def build(row: str, length: int, notes: list[str] | None = None) -> torch.nn.Module:
    """The module of ``row``, with the issue's options that the mechanism accepts."""
    if row == SDPA:
        return Dense()
    name = "local" if row.startswith("local") else row
    wanted = ISSUE_OPTIONS.get(row, {})
    accepted = MECHANISMS.option_names(name, wanted)
    options = {k: v for k, v in wanted.items() if accepted is None or k in accepted}
    if notes is not None and len(options) < len(wanted):
        dropped = ", ".join(sorted(set(wanted) - set(options)))
        notes.append(f"`{row}` has no option {dropped}: its default is used.")
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=H, max_len=length, **options).eval()


def inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, length, D, generator=g) for _ in range(4))


def forward_fn(attn: torch.nn.Module, q, k, v) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return attn(q, k, v)

    return run


def train_fn(attn: torch.nn.Module, q, k, v, grad) -> Callable[[], None]:
    """Forward and backward with fresh input gradients each call."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def run() -> None:
        q.grad = k.grad = v.grad = None
        attn(q, k, v).backward(grad)

    return run


def timed_rounds(
    fns: dict[str, Callable[[], Any]], rounds: int, seconds: float, label: str
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, int]]:
    """Interleaved rounds: in each, every candidate runs ``calls`` times (about ``seconds``,
    at least once; the candidates are warm already); median of the per-round medians."""
    single = {n: measure_time(fn, repeats=1, warmup=0).median for n, fn in fns.items()}
    calls = {n: max(1, min(20, round(seconds / max(s, 1e-9)))) for n, s in single.items()}
    per_round: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            per_round[name].append(measure_time(fn, repeats=calls[name], warmup=0).median)
        print(
            f"{label} round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {t[-1] * 1e3:.1f} ms" for n, t in per_round.items()),
            flush=True,
        )
    return {n: median_of_rounds(t) for n, t in per_round.items()}, per_round, calls


def rows_at(length: int, names: list[str], args, notes: list[str]) -> list[str]:
    """The rows run at ``length``: the dense ones where they fit, then the sparse ones."""
    rows = []
    if dense_fits(length, B, H, args.memory_cap_gb * 2**30):
        rows.append(SDPA)
        if length <= args.softmax_max_length:
            rows.append("softmax")
    else:
        gib = score_bytes(length, B, H) / 2**30
        notes.append(
            f"L={length}: `sdpa` and `softmax` skipped, their (B, H, L, L) fp32 scores "
            f"({gib:.0f} GiB) exceed the {args.memory_cap_gb:g} GiB cap."
        )
    return rows + names


def measure_length(length: int, names: list[str], args, notes: list[str]) -> dict:
    q, k, v, grad = inputs(length)
    rows = rows_at(length, names, args, notes)
    modules = {
        row: build(row, length, notes if length == args.lengths[0] else None) for row in rows
    }
    fwd = {row: forward_fn(m, q, k, v) for row, m in modules.items()}
    train = {row: train_fn(m, q, k, v, grad) for row, m in modules.items()}
    fwd_mem = {row: peak_memory_bytes(fn) for row, fn in fwd.items()}  # also warms up
    train_mem = {row: peak_memory_bytes(fn) for row, fn in train.items()}
    rounds = args.rounds if length <= 4096 else args.long_rounds
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, args.matmul_size, args.matmul_size, generator=g)
    fwd[MATMUL] = lambda: a @ b  # timed in the same rounds, for local's FLOP bound
    f = timed_rounds(fwd, rounds, args.seconds, f"L={length} forward")
    t = timed_rounds(train, rounds, args.seconds, f"L={length} forward+backward")
    return {
        "forward": f,
        "train": t,
        "forward_memory": fwd_mem,
        "train_memory": train_mem,
        "band": modules["local"].band(False),
    }


def check_correctness(names: list[str], length: int) -> dict[str, float]:
    """Max abs difference of each row's forward from its dense reference (fp32)."""
    q, k, v, _ = inputs(length, seed=1)
    errors = {SDPA: float((Dense()(q, k, v) - softmax_attention_reference(q, k, v)).abs().max())}
    for row in ["softmax", *names]:
        attn = build(row, length)
        with torch.no_grad():
            errors[row] = float((attn(q, k, v) - attn.reference(q, k, v)).abs().max())
    for row, err in errors.items():
        if not err <= 1e-4:
            raise SystemExit(f"correctness check failed: {row} differs by {err:.3g}")
    return errors


def local_bound(runs: dict, matmul_size: int) -> dict:
    """Per length: local's forward against ``2·B·H·Σ_i|band(i)|·(D + Dv)`` FLOPs at the fp32
    matmul throughput of the same rounds (``2·n³`` FLOPs of an ``(n, n)`` product)."""
    out = {}
    for length, run in runs.items():
        back, fwd = run["band"]
        pairs = band_keys(length, back, fwd)
        flops = band_flops(pairs, B, H, D, D)
        medians, per_round = run["forward"][0], run["forward"][1]
        gflops = 2 * matmul_size**3 / medians.pop(MATMUL) / 1e9
        matmul = per_round.pop(MATMUL)
        ratios = [
            t * 2 * matmul_size**3 / (m * flops)
            for t, m in zip(per_round["local"], matmul, strict=True)
        ]
        bound = flops / (gflops * 1e9)
        out[str(length)] = {
            "pairs": pairs,
            "flops": flops,
            "gflops": gflops,
            "bound_seconds": bound,
            "seconds": medians["local"],
            "ratio": medians["local"] / bound,
            "round_ratios": ratios,
        }
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384,65536")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds, L ≤ 4096")
    parser.add_argument("--long-rounds", type=int, default=3, help="rounds for L > 4096")
    parser.add_argument("--seconds", type=float, default=0.3, help="per candidate per round")
    parser.add_argument(
        "--memory-cap-gb",
        type=float,
        default=4.0,
        help="run dense attention only where its L×L scores fit",
    )
    parser.add_argument("--softmax-max-length", type=int, default=4096)
    parser.add_argument("--matmul-size", type=int, default=2048, help="for the FLOP bound")
    parser.add_argument("--decode-contexts", default="512,2048,8192,32768")
    parser.add_argument("--decode-steps", type=int, default=50)
    parser.add_argument("--side-lengths", default="4096,16384")
    parser.add_argument(
        "--local-attention-path",
        type=Path,
        default=None,
        help="folder with lucidrains' local-attention (prepended to sys.path)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's own, one per core)",
    )
    parser.add_argument("--quick", action="store_true", help="short lengths, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.long_rounds, args.seconds = "256,512", 2, 2, 0.02
        args.matmul_size = 256
        args.decode_contexts, args.decode_steps, args.side_lengths = "64,256", 5, "256"
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.decode_contexts = [int(x) for x in args.decode_contexts.split(",")]
    args.side_lengths = [int(x) for x in args.side_lengths.split(",")]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.local_attention_path is not None:
        sys.path.insert(0, str(args.local_attention_path))
    return args


def main() -> None:
    args = parse_args()
    load_start, start = os.getloadavg(), time.perf_counter()
    notes: list[str] = []
    names = sparse_names(notes)
    check_length = min(512, *args.lengths)
    correctness = check_correctness(names, check_length)
    runs = {length: measure_length(length, names, args, notes) for length in args.lengths}
    decode = measure_decoding(args.decode_contexts, args.decode_steps, args.rounds, WINDOW)
    side, side_version = side_by_side(
        args.side_lengths, BLOCKED_WINDOW, args.rounds, notes, has_blocked_variant()
    )
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "batch": B,
            "heads": H,
            "head_dim": D,
            "value_dim": D,
            "dtype": "float32",
            "causal": False,
            "window": WINDOW,
            "blocked_window": BLOCKED_WINDOW,
            "issue_options": ISSUE_OPTIONS,
            "rounds": f"{args.rounds} (L ≤ 4096), {args.long_rounds} (longer)",
            "seconds_per_round": args.seconds,
            "memory_cap_gb": args.memory_cap_gb,
            "decode_rounds": args.rounds,
            "decode_steps": args.decode_steps,
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_seconds": time.perf_counter() - start,
        "correctness": correctness,
        "correctness_length": check_length,
        "matmul_size": args.matmul_size,
    }
    report["local_bound"] = local_bound(runs, args.matmul_size)  # takes the matmul rows out
    for key in ("forward", "train"):
        report[f"{key}_seconds"] = {str(n): r[key][0] for n, r in runs.items()}
        report[f"{key}_round_seconds"] = {str(n): r[key][1] for n, r in runs.items()}
        report[f"{key}_memory"] = {str(n): r[f"{key}_memory"] for n, r in runs.items()}
    report["decode"], report["side_by_side"] = decode, side
    report["side_by_side_version"] = side_version
    report["notes"] = notes
    report["targets"] = targets(report)
    write_run(args.out, "sparse", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
