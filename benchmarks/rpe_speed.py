"""Speed of kernelized attention with relative positional encodings (RPE) on the CPU.

Measured in one run on one machine, B=1, H=1, D=Dv=64, M=32 PRF features, fp32, forward:

* the FFT path (``rpe="toeplitz"``, Luo et al. Algorithm 1) against the dense O(L²) RPE
  reference (``rpe_method="dense"``) over lengths: the crossover and the ratio at the longest;
* at L = ``--length``: the banded path (``rpe="bucketed"``, ``max_distance=128``) against the FFT
  path and against plain ``performer`` with the same M, non-causal and causal;
* decoding: time per token of ``step()`` at position 128 and at position ``--length``, for
  ``rpe="decay"`` (constant) and ``rpe="bucketed"`` (window + state, constant).

Times are medians of interleaved rounds (see ``kattn.bench.interleaved_rounds``). Results go to
``benchmarks/results/rpe-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/rpe_speed.py            # the committed results
    python benchmarks/rpe_speed.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import kattn
from kattn.bench import interleaved_rounds, machine_info
from kattn.bench.script_results import machine_line, write_run

RESULTS = Path(__file__).resolve().parent / "results"
D, M = 64, 32
TARGETS = {  # ratio name -> (minimum, or maximum when negative) required by the RPE issue
    "non-causal: banded vs FFT": 30.0,
    "causal: banded vs FFT": 30.0,
    "non-causal: banded / performer": -4.0,
    "causal: banded / performer": -4.0,
    "decode: decay step at L / at 128": -1.5,
}


def build(name: str, max_len: int, **options) -> kattn.Attention:
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=1, max_len=max_len, num_features=M, **options)


def inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 1, length, D, generator=g) for _ in range(3))


def models(max_len: int) -> dict[str, kattn.Attention]:
    prf = {"feature_map": "prf"}
    return {
        "fft": build("kernelized", max_len, rpe="toeplitz", rpe_method="fft", **prf).eval(),
        "dense": build("kernelized", max_len, rpe="toeplitz", rpe_method="dense", **prf).eval(),
        "banded": build("kernelized", max_len, rpe="bucketed", max_distance=128, **prf).eval(),
        "banded dense": build(
            "kernelized", max_len, rpe="bucketed", max_distance=128, rpe_method="dense", **prf
        ).eval(),
        "decay": build("kernelized", max_len, rpe="decay", **prf).eval(),
        "decay dense": build("kernelized", max_len, rpe="decay", rpe_method="dense", **prf).eval(),
        "performer": build("performer", max_len).eval(),
    }


def randomize(attn: kattn.Attention, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in attn.rpe.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.5)


def check_correctness(ms: dict[str, kattn.Attention]) -> dict[str, float]:
    """Before timing: each fast path equals the dense reference at L=2048."""
    q, k, v = inputs(2048, seed=1)
    errors = {}
    for fast, dense in (("fft", "dense"), ("banded", "banded dense"), ("decay", "decay dense")):
        for causal in (False, True):
            err = (ms[fast](q, k, v, causal=causal) - ms[dense](q, k, v, causal=causal)).abs()
            errors[f"{fast} {'causal' if causal else 'non-causal'}"] = float(err.max())
    for name, err in errors.items():
        if err > 1e-4:
            raise SystemExit(f"correctness check failed: {name} max abs error {err:.3g}")
    return errors


def decode_seconds(attn: kattn.Attention, length: int, window: int = 64) -> dict[int, float]:
    """Median seconds per ``step()`` over ``window`` tokens from position 128 and from
    position ``length − window``."""
    q, k, v = inputs(length, seed=2)
    state = attn.init_state(1, 1)
    marks = {128: [], length - window: []}
    for t in range(length):
        one = slice(t, t + 1)
        start = time.perf_counter()
        _, state = attn.step(q[:, :, one], k[:, :, one], v[:, :, one], state)
        took = time.perf_counter() - start
        for mark, times in marks.items():
            if mark <= t < mark + window:
                times.append(took)
    return {mark: statistics.median(times) for mark, times in marks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sweep-rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per candidate per round")
    parser.add_argument("--quick", action="store_true", help="short lengths, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.length, args.lengths = 2048, "256,1024,2048"
        args.rounds, args.sweep_rounds, args.seconds = 2, 1, 0.05
    lengths = [int(x) for x in args.lengths.split(",")]
    ms = models(max(args.length, *lengths))
    with torch.no_grad():
        for name in ("fft", "dense", "banded", "banded dense", "decay", "decay dense"):
            randomize(ms[name])
        for fast, dense in (("dense", "fft"), ("banded dense", "banded"), ("decay dense", "decay")):
            ms[fast].load_state_dict(ms[dense].state_dict())
        correctness = check_correctness(ms)
        sweep = {}
        for length in lengths:
            q, k, v = inputs(length)
            fns: dict[str, Callable[[], torch.Tensor]] = {
                "fft": lambda q=q, k=k, v=v: ms["fft"](q, k, v),
                "dense": lambda q=q, k=k, v=v: ms["dense"](q, k, v),
            }
            print(f"sweep L={length}", flush=True)
            sweep[length] = interleaved_rounds(
                fns, rounds=args.sweep_rounds, seconds=args.seconds
            ).seconds
        q, k, v = inputs(args.length)
        fns = {}
        for causal in (False, True):
            mode = "causal" if causal else "non-causal"
            for name in ("banded", "fft", "performer", "decay"):
                fns[f"{name} {mode}"] = lambda n=name, c=causal: ms[n](q, k, v, causal=c)
        timed = interleaved_rounds(fns, rounds=args.rounds, seconds=args.seconds)
        decode = {
            name: decode_seconds(ms[name], args.length) for name in ("decay", "banded", "performer")
        }
    s, rs = timed.seconds, timed.round_seconds
    pairs = {
        f"{mode}: {a} {'vs' if inverse else '/'} {b}": (f"{a} {mode}", f"{b} {mode}", inverse)
        for mode in ("non-causal", "causal")
        for a, b, inverse in (("banded", "FFT", True), ("banded", "performer", False))
    }
    names = {"FFT": "fft"}
    ratios, round_ratios = {}, {}
    for label, (a, b, inverse) in pairs.items():
        a, b = a.replace("FFT", names["FFT"]), b.replace("FFT", names["FFT"])
        num, den = (b, a) if inverse else (a, b)
        ratios[label] = s[num] / s[den]
        round_ratios[label] = [x / y for x, y in zip(rs[num], rs[den], strict=True)]
    first, last = sorted(decode["decay"])
    ratios["decode: decay step at L / at 128"] = decode["decay"][last] / decode["decay"][first]
    crossover = next((n for n in lengths if sweep[n]["fft"] < sweep[n]["dense"]), None)
    report = {
        "machine": machine_info(),
        "config": {
            "batch": 1,
            "heads": 1,
            "head_dim": D,
            "value_dim": D,
            "features": M,
            "dtype": "float32",
            "pass": "forward",
            "length": args.length,
            "rounds": args.rounds,
            "repeats_per_round": timed.repeats,
            "bucketed_band": [ms["banded"].rpe.left, ms["banded"].rpe.right],
        },
        "correctness_max_abs_error": correctness,
        "sweep_seconds": sweep,
        "fft_vs_dense_crossover_length": crossover,
        "seconds": s,
        "round_seconds": rs,
        "ratios": ratios,
        "round_ratios": round_ratios,
        "decode_seconds_per_token": decode,
        "targets": TARGETS,
    }
    write_run(args.out, "rpe", report, render(report), quick=args.quick)


def render(report: dict) -> str:
    info, cfg = report["machine"], report["config"]
    left, right = cfg["bucketed_band"]
    lines = [
        "# Relative positional encodings: FFT, banded and decay paths on the CPU",
        "",
        machine_line(info),
        f"B=1, H=1, D=Dv={cfg['head_dim']}, M={cfg['features']} PRF features, fp32, forward. "
        "Medians of interleaved rounds. `bucketed` (32 buckets, max_distance 128) is constant "
        f"beyond offsets −{left} and +{right}, its band.",
        "",
        "## FFT path vs the dense O(L²) reference (non-causal)",
        "",
        "| L | FFT (ms) | dense (ms) | dense / FFT |",
        "|---|---|---|---|",
    ]
    for length, row in report["sweep_seconds"].items():
        fft, dense = row["fft"], row["dense"]
        lines.append(f"| {length} | {fft * 1e3:.2f} | {dense * 1e3:.2f} | {dense / fft:.2f}× |")
    cross = report["fft_vs_dense_crossover_length"]
    lines += [
        "",
        f"The FFT path is faster from L = {cross} on (first measured length where it wins).",
        "",
        f"## At L = {cfg['length']}",
        "",
        "| path | time (ms) | calls per round |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {sec * 1e3:.2f} | {cfg['repeats_per_round'][name]} |"
        for name, sec in report["seconds"].items()
    ]
    lines += ["", "| ratio | measured | per-round range | target | met |", "|---|---|---|---|---|"]
    for name, ratio in report["ratios"].items():
        target = report["targets"][name]
        met = ratio >= target if target > 0 else ratio <= -target
        spread = report["round_ratios"].get(name)
        span = f"{min(spread):.1f}–{max(spread):.1f}×" if spread else "—"
        bound = f"≥ {target:.0f}×" if target > 0 else f"≤ {-target:g}×"
        lines.append(f"| {name} | {ratio:.2f}× | {span} | {bound} | {'yes' if met else 'NO'} |")
    lines += ["", "Decoding, median seconds per `step()` over 64 tokens from each position:", ""]
    decode = report["decode_seconds_per_token"]
    marks = sorted(next(iter(decode.values())))
    lines += ["| mechanism | " + " | ".join(f"at {m} (µs)" for m in marks) + " |"]
    lines += ["|---|" + "---|" * len(marks)]
    for name, row in decode.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m] * 1e6:.0f}" for m in marks) + " |")
    lines += [
        "",
        "Correctness checked first (max abs error against the dense reference at L=2048): "
        + ", ".join(f"{k} {v:.1e}" for k, v in report["correctness_max_abs_error"].items())
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
