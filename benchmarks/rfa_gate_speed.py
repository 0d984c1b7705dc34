"""Speed of gated random feature attention (``rfa_gate``) against ungated ``rfa`` on the CPU.

One run on one machine: B=1, H=4, D=Dv=64, fp32, causal, each mechanism with its registered
defaults (TRF, M=256 features, 64-token chunks), at L = 1K, 4K, 16K. Two passes are timed:
forward + backward of ``out.square().sum()`` (the target: ``rfa_gate`` within 1.5× of ``rfa``)
and the forward alone under ``torch.no_grad()``. Times are medians over interleaved rounds
(``kattn.bench.interleaved_rounds``), so the noise of a shared machine falls on both alike; the
ratio of the medians is reported per length.

Before timing, ``rfa_gate`` is checked against its dense reference (float64, L=300, several
chunks) and its decoding steps against its causal forward.

Results go to ``benchmarks/results/rfa-gate-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/rfa_gate_speed.py --threads 1     # one thread, the default lengths
    python benchmarks/rfa_gate_speed.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kattn
from kattn.bench import interleaved_rounds, machine_info
from kattn.bench.script_results import write_run

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D = 1, 4, 64
NAMES = ("rfa", "rfa_gate")
TARGET = 1.5


def check_correctness() -> dict[str, float]:
    """Largest errors of ``rfa_gate`` against its dense reference and of its steps against
    the causal forward (float64)."""
    torch.manual_seed(0)
    attn = kattn.build("rfa_gate", head_dim=16, num_heads=2).double().eval()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g, dtype=torch.float64) for _ in range(3))
    errors = {}
    for causal in (True, False):
        out = attn(q, k, v, causal=causal)
        ref = attn.reference(q, k, v, causal=causal)
        errors[f"reference {'causal' if causal else 'bidirectional'}"] = float(
            (out - ref).abs().max()
        )
    full = attn(q[:, :, :40], k[:, :, :40], v[:, :, :40], causal=True)
    state = attn.init_state(1, 2, dtype=torch.float64)
    steps = []
    for t in range(40):
        one = slice(t, t + 1)
        out, state = attn.step(q[:, :, one], k[:, :, one], v[:, :, one], state)
        steps.append(out)
    errors["steps"] = float((torch.cat(steps, dim=2) - full).abs().max())
    worst = max(errors.values())
    if worst > 1e-8:
        raise RuntimeError(f"rfa_gate is not correct here: {errors}")
    return errors


def workloads(length: int) -> dict[str, dict[str, Callable[[], Any]]]:
    """``{pass: {mechanism: call}}`` on one set of inputs."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, length, D, generator=g) for _ in range(3))
    grad_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    calls: dict[str, dict[str, Callable[[], Any]]] = {"forward+backward": {}, "forward": {}}
    for name in NAMES:
        torch.manual_seed(0)
        attn = kattn.build(name, head_dim=D, num_heads=H, max_len=length)

        def train(attn: kattn.Attention = attn) -> None:
            out = attn(*grad_inputs, causal=True)
            out.square().sum().backward()

        @torch.no_grad()
        def forward(attn: kattn.Attention = attn) -> None:
            attn(q, k, v, causal=True)

        calls["forward+backward"][name] = train
        calls["forward"][name] = forward
    return calls


def render(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        f"# rfa_gate vs rfa, causal, B={B}, H={H}, D={D}, fp32, {info['torch_threads']} "
        f"thread(s), {info['processor']}",
        "",
        "| L | pass | rfa (ms) | rfa_gate (ms) | rfa_gate / rfa |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']} | {r['pass']} | {r['rfa_ms']:.1f} | {r['rfa_gate_ms']:.1f} | "
            f"{r['ratio']:.2f}× |"
        )
    lines += ["", f"Target: forward+backward ratio at most {TARGET}×.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per candidate per round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="L=256, 512, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lengths = [256, 512] if args.quick else [int(x) for x in args.lengths.split(",")]
    rounds, seconds = (2, 0.05) if args.quick else (args.rounds, args.seconds)
    errors = check_correctness()
    print(f"correctness: {errors}")
    rows = []
    for length in lengths:
        for pass_name, fns in workloads(length).items():
            print(f"L={length} {pass_name}")
            timing = interleaved_rounds(fns, rounds=rounds, seconds=seconds)
            ms = {name: timing.seconds[name] * 1e3 for name in NAMES}
            rows.append(
                {
                    "length": length,
                    "pass": pass_name,
                    "rfa_ms": ms["rfa"],
                    "rfa_gate_ms": ms["rfa_gate"],
                    "ratio": ms["rfa_gate"] / ms["rfa"],
                    "round_ms": {n: [t * 1e3 for t in timing.round_seconds[n]] for n in NAMES},
                }
            )
    info = machine_info()
    report = {
        "benchmark": "rfa-gate",
        "machine": info,
        "config": {"B": B, "H": H, "D": D, "rounds": rounds, "seconds": seconds},
        "correctness": errors,
        "rows": rows,
    }
    write_run(args.out, "rfa-gate", report, render(rows, info), quick=args.quick)


if __name__ == "__main__":
    main()
