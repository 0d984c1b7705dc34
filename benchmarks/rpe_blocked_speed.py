"""The two paths of the Toeplitz relative positional encoding on the CPU: the exact blocked form
(``rpe_method="dense"``) against the FFT of Luo et al. Algorithm 1 (``rpe_method="fft"``).

``kernelized`` attention with PRF features and ``rpe="toeplitz"`` (a random bias), B=1, H=1,
D=Dv=64, fp32, for M in 32, 64, 256 features and several lengths: forward non-causal, forward
causal, and a training step (causal forward + backward of a sum). The FFT is skipped where one
call would take many seconds (L·M above 2^20 forward, 2^18 training). Each row also says which
path ``rpe_method="auto"`` picks. Times are medians of interleaved rounds; outputs of the two
paths are compared before timing. Results go to
``benchmarks/results/rpe-blocked-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/rpe_blocked_speed.py            # the committed results
    python benchmarks/rpe_blocked_speed.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import kattn
from kattn.bench import interleaved_rounds, machine_info
from kattn.bench.script_results import write_run

RESULTS = Path(__file__).resolve().parent / "results"
D = 64
MODES = ("forward", "forward causal", "train causal")


def build(method: str, m: int, length: int) -> kattn.Attention:
    torch.manual_seed(0)
    attn = kattn.build(
        "kernelized", head_dim=D, num_heads=1, max_len=length, num_features=m,
        feature_map="prf", rpe="toeplitz", rpe_method=method,
    )  # fmt: skip
    with torch.no_grad():
        attn.rpe.bias.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    return attn


def call(attn: kattn.Attention, q, k, v, mode: str):
    causal = mode != "forward"
    if mode.startswith("train"):
        return lambda: attn(q, k, v, causal=True).sum().backward()

    def forward():
        with torch.no_grad():
            return attn(q, k, v, causal=causal)

    return forward


def measure(m: int, length: int, args) -> list[dict]:
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, 1, length, D, generator=g) for _ in range(3))
    paths = {name: build(name, m, length) for name in ("dense", "fft", "auto")}
    for mode in MODES:
        with torch.no_grad():
            causal = mode != "forward"
            if length * m <= 1 << 16:  # the two paths agree (checked where the FFT is quick)
                a, b = (paths[p](q, k, v, causal=causal) for p in ("dense", "fft"))
                err = float((a - b).abs().max() / b.abs().max())
                assert err < 1e-4, f"M={m} L={length} {mode}: relative error {err:.2e}"
    rows = []
    for mode in MODES:
        limit = (1 << 18) if mode.startswith("train") else (1 << 20)
        for x in (q, k, v):
            x.requires_grad_(mode.startswith("train"))
        fns = {"blocked": call(paths["dense"], q, k, v, mode)}
        if length * m <= limit:
            fns["fft"] = call(paths["fft"], q, k, v, mode)
        print(f"M={m} L={length} {mode}", flush=True)
        timed = interleaved_rounds(fns, rounds=args.rounds, seconds=args.seconds, log=None)
        auto = paths["auto"].rpe._auto_method(
            torch.empty(1, 1, length, m), torch.empty(1, 1, length, m),
            torch.empty(1, 1, length, D), mode != "forward",
        )  # fmt: skip
        rows.append(
            {
                "features": m,
                "length": length,
                "mode": mode,
                "blocked_seconds": timed.seconds["blocked"],
                "fft_seconds": timed.seconds.get("fft"),
                "round_seconds": timed.round_seconds,
                "auto_picks": "blocked" if auto == "dense" else "fft",
            }
        )
    return rows


def render(report: dict) -> str:
    info = report["machine"]
    lines = [
        "# Toeplitz RPE on the CPU: the exact blocked form against the FFT",
        "",
        f"{info['processor']}, {info['torch_threads']} threads; torch {info['torch']}, "
        f"kattn {info['kattn']}. B=1, H=1, D=Dv=64, PRF features, fp32; medians of "
        f"{report['config']['rounds']} interleaved rounds. Training = causal forward + backward.",
        "",
        "| M | L | pass | blocked (ms) | FFT (ms) | FFT / blocked | auto picks |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        fft = row["fft_seconds"]
        blocked = row["blocked_seconds"]
        fft_cell = "skipped" if fft is None else f"{fft * 1e3:.1f}"
        ratio = "—" if fft is None else f"{fft / blocked:.2f}×"
        lines.append(
            f"| {row['features']} | {row['length']} | {row['mode']} | {blocked * 1e3:.1f} | "
            f"{fft_cell} | {ratio} | {row['auto_picks']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", default="32,64,256")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.3, help="timed per candidate per round")
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 short round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.features, args.lengths, args.rounds, args.seconds = "16", "128,256", 1, 0.01
    rows = []
    for m in (int(x) for x in args.features.split(",")):
        for length in (int(x) for x in args.lengths.split(",")):
            rows += measure(m, length, args)
    info = machine_info()
    report = {
        "machine": info,
        "config": {"batch": 1, "heads": 1, "head_dim": D, "rounds": args.rounds},
        "rows": rows,
    }
    write_run(args.out, "rpe-blocked", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
