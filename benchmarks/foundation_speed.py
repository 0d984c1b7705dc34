"""Speed and memory of kernelized attention against softmax on the CPU (the foundation targets).

Measured in one run on one machine, B=1, H=1, D=Dv=64, M=64 features, fp32, forward:

* causal ``performer`` (chunkwise-parallel) vs causal softmax (``scaled_dot_product_attention``
  with ``is_causal=True``) and vs the cumulative-sum formulation of causal linear attention;
* non-causal ``performer`` vs softmax;
* peak memory of each against the sequence length.

Times are medians: in each of ``--rounds`` interleaved rounds every candidate is warmed up
and timed for about ``--seconds`` (at least 3 calls), and the reported time is the median of
the round medians; ratios are taken between those medians, and per-round ratios are kept too.
Results go to ``benchmarks/results/foundation-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/foundation_speed.py            # the committed results
    python benchmarks/foundation_speed.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import kattn
from kattn.bench import interleaved_rounds, machine_info, peak_memory_bytes
from kattn.functional import linear_attention_cumsum, linear_attention_reference

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {  # ratio name -> minimum required by the foundation issue
    "causal: performer vs softmax": 20.0,
    "causal: performer vs cumsum formulation": 30.0,
    "non-causal: performer vs softmax": 20.0,
}


def inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 1, length, 64, generator=g) for _ in range(3))  # type: ignore[return-value]


def candidates(attn: kattn.Attention, q, k, v) -> dict[str, Callable[[], torch.Tensor]]:
    def cumsum() -> torch.Tensor:
        # the same PRF features, aggregated by a prefix sum over (L, M, Dv) outer products
        return linear_attention_cumsum(attn.query_features(q), attn.features(k).dense(), v)

    return {
        "performer causal": lambda: attn(q, k, v, causal=True),
        "softmax causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "cumsum causal": cumsum,
        "performer": lambda: attn(q, k, v),
        "softmax": lambda: F.scaled_dot_product_attention(q, k, v),
    }


def check_correctness(attn: kattn.Attention) -> dict[str, float]:
    """Before timing: the fast paths equal their references (on a length the reference fits)."""
    q, k, v = inputs(2048, seed=1)
    fq, fk = attn.features(q).values, attn.features(k).dense()
    errors = {}
    for causal in (False, True):
        ref = linear_attention_reference(fq.double(), fk.double(), v.double(), causal=causal)
        got = attn(q, k, v, causal=causal).double()
        errors[f"{'causal' if causal else 'non-causal'} max abs error vs reference"] = float(
            (got - ref).abs().max()
        )
    for name, err in errors.items():
        if err > 1e-4:
            raise SystemExit(f"correctness check failed: {name} = {err:.3g}")
    return errors


def main() -> None:
    from kattn.bench.script_results import write_run  # see render()

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--memory-lengths", default="1024,2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per candidate per round")
    parser.add_argument("--quick", action="store_true", help="L=2048, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.length, args.rounds, args.seconds = 2048, 2, 0.05
        args.memory_lengths = "512,1024,2048"

    torch.manual_seed(0)
    attn = kattn.build("performer", head_dim=64, num_heads=1, num_features=64).eval()
    with torch.no_grad():
        correctness = check_correctness(attn)
        q, k, v = inputs(args.length)
        fns = candidates(attn, q, k, v)
        timed = interleaved_rounds(fns, rounds=args.rounds, seconds=args.seconds)
        seconds, rounds, repeats = timed.seconds, timed.round_seconds, timed.repeats
        pairs = {
            "causal: performer vs softmax": ("softmax causal", "performer causal"),
            "causal: performer vs cumsum formulation": ("cumsum causal", "performer causal"),
            "non-causal: performer vs softmax": ("softmax", "performer"),
        }
        ratios = {k: seconds[a] / seconds[b] for k, (a, b) in pairs.items()}
        round_ratios = {
            k: [x / y for x, y in zip(rounds[a], rounds[b], strict=True)]
            for k, (a, b) in pairs.items()
        }
        memory = {}
        for length in (int(x) for x in args.memory_lengths.split(",")):
            q, k, v = inputs(length)
            fns = candidates(attn, q, k, v)
            memory[length] = {
                name: peak_memory_bytes(fn)
                for name, fn in fns.items()
                if "cumsum" not in name or length <= 8192
            }
            print(
                f"memory L={length}: "
                + ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in memory[length].items()),
                flush=True,
            )

    report = {
        "machine": machine_info(),
        "config": {
            "batch": 1,
            "heads": 1,
            "head_dim": 64,
            "value_dim": 64,
            "features": 64,
            "dtype": "float32",
            "pass": "forward",
            "length": args.length,
            "rounds": args.rounds,
            "repeats_per_round": repeats,
            "chunk_size": attn.chunk_size,
            "block_size": attn.block_size,
        },
        "correctness": correctness,
        "seconds": seconds,
        "round_seconds": rounds,
        "ratios": ratios,
        "round_ratios": round_ratios,
        "targets": TARGETS,
        "peak_memory_bytes": memory,
    }
    write_run(args.out, "foundation", report, render(report), quick=args.quick)


def render(report: dict) -> str:
    # imported here, not above: before_after.py imports this module's inputs and candidates
    # under older versions of kattn, which may not have it
    from kattn.bench.script_results import machine_line

    info, cfg = report["machine"], report["config"]
    lines = [
        "# Foundation benchmark: kernelized vs softmax attention on the CPU",
        "",
        machine_line(info),
        f"B=1, H=1, D=Dv=64, M=64, fp32, forward, L={cfg['length']}; chunk {cfg['chunk_size']}, "
        f"block {cfg['block_size']}. Median of the medians of {cfg['rounds']} interleaved "
        "rounds (timed calls per round in the last column).",
        "",
        "| path | time (ms) | calls per round |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {s * 1e3:.2f} | {cfg['repeats_per_round'][name]} |"
        for name, s in report["seconds"].items()
    ]
    lines += [
        "",
        "| ratio | measured | per-round range | target | met |",
        "|---|---|---|---|---|",
    ]
    for name, ratio in report["ratios"].items():
        target = report["targets"][name]
        met = "yes" if ratio >= target else "NO"
        low, high = min(report["round_ratios"][name]), max(report["round_ratios"][name])
        lines.append(f"| {name} | {ratio:.1f}× | {low:.1f}–{high:.1f}× | ≥ {target:.0f}× | {met} |")
    lengths = list(report["peak_memory_bytes"])
    names = list(report["peak_memory_bytes"][lengths[0]])
    lines += [
        "",
        "Peak memory of tensor allocations (MiB):",
        "",
        "| L | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for length in lengths:
        row = report["peak_memory_bytes"][length]
        cells = [f"{row[n] / 2**20:.1f}" if n in row else "—" for n in names]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Correctness checked first (max abs error against the quadratic reference at "
        "L=2048): " + ", ".join(f"{k} {v:.1e}" for k, v in report["correctness"].items()) + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
