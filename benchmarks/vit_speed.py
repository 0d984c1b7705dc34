"""Speed and peak memory of one Vision Transformer block on the CPU: ``nprf_rpe`` with the 2-D
relative positional encoding against softmax (Luo et al. 2021, §4.4, Table 4).

One ``kattn.nn.EncoderLayer`` (pre-LN, GELU MLP) at DeiT-small width: dim 384, 6 heads of 64,
FFN 1536; batch 8 (``--batch``), fp32, random init (``torch.manual_seed(0)``), training mode
without dropout. Its input is the patch tokens of an image: 64×64, 128×128 and 224×224 images
in 4×4 patches (grids 16×16, 32×32, 56×56: L = 256, 1,024, 3,136) and 64×64 in 1-pixel
patches (64×64: L = 4,096). Three attentions:

* ``softmax``: kattn's softmax mechanism (PyTorch's ``scaled_dot_product_attention``);
* ``nprf_rpe``: positive random features of normalised queries and keys, M = 32 (the paper's
  feature count for images), with ``rpe="toeplitz2d"`` on the patch grid (one learnable bias
  per (Δrow, Δcol) and head, Swin's 2-D encoding) and ``rpe_method="auto"`` (the exact
  blocked form or the 2-D FFT, whichever it predicts faster; the table says which);
* ``nprf_rpe fft``: the same with ``rpe_method="fft"`` (the paper's O(n log n) path, Luo et
  al. 2021, §3.2), so that both paths are measured whichever ``auto`` picks.

Each mechanism's attention is first checked against its dense reference (batch 1) at every
size up to ``--check-max-length`` tokens. Then, per size, a forward + backward of the block
(fresh input and parameter gradients each call): its peak memory (one call, which is also the
warm-up; ``kattn.bench.peak_memory_bytes``) and its time, the median over interleaved rounds
(``kattn.bench.interleaved_rounds``; 5 rounds up to L = 1,024, 3 beyond) of the median of
the calls in each round, with the softmax / ``nprf_rpe`` ratio of the medians and within each
round. Pass ``--threads 1`` on a shared machine (see the README).

Results go to ``benchmarks/results/vit-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/vit_speed.py --threads 1    # the full run (needs a quiet machine)
    python benchmarks/vit_speed.py --quick        # a smoke run: two small sizes, 1 round
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

from kattn.bench import (
    interleaved_rounds,
    machine_info,
    peak_memory_bytes,
)
from kattn.bench.script_results import write_run
from kattn.nn import EncoderLayer
from vit_speed_report import CONFIGS, FFT, KERNELIZED, SOFTMAX, parse_sizes, ratio_summary, render

RESULTS = Path(__file__).resolve().parent / "results"
DIM, HEADS, FFN = 384, 6, 1536
NUM_FEATURES = 32
SIZES, QUICK_SIZES = "64x4,128x4,224x4,64x1", "32x4,16x1"


def options(name: str, grid: tuple[int, int]) -> dict[str, Any]:
    """The attention options of configuration ``name`` on a patch grid."""
    if name == SOFTMAX:
        return {"mechanism": "softmax"}
    method = {"rpe_method": "fft"} if name == FFT else {}
    return {"mechanism": "nprf_rpe", "rpe": "toeplitz2d", "grid": grid,
            "num_features": NUM_FEATURES, **method}  # fmt: skip


def build(name: str, grid: tuple[int, int]) -> EncoderLayer:
    torch.manual_seed(0)
    length = grid[0] * grid[1]
    return EncoderLayer(DIM, HEADS, FFN, max_len=length, **options(name, grid)).train()


def check_attention(layer: EncoderLayer, length: int) -> float:
    """Max abs difference of the block's attention from its dense reference (batch 1)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, HEADS, length, DIM // HEADS, generator=g) for _ in range(3))
    attention = layer.attn.attention
    with torch.no_grad():
        return float((attention(q, k, v) - attention.reference(q, k, v)).abs().max())


def kernelized_path(layer: EncoderLayer, batch: int, length: int) -> str:
    """The path ``rpe_method="auto"`` takes for this block's forward."""
    phi = torch.empty(batch, HEADS, length, NUM_FEATURES)
    v = torch.empty(batch, HEADS, length, DIM // HEADS)
    method = layer.attn.attention.rpe._auto_method(phi, phi, v, False)
    return "blocked (exact)" if method == "dense" else method


def train_step(layer: EncoderLayer, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
    """One forward + backward with fresh gradients of the input and the parameters."""

    def run() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(grad)

    return run


def measure(image: int, patch: int, args: argparse.Namespace) -> dict[str, Any]:
    grid = (image // patch, image // patch)
    length = grid[0] * grid[1]
    g = torch.Generator().manual_seed(length)
    x = torch.randn(args.batch, length, DIM, generator=g).requires_grad_()
    grad = torch.randn(args.batch, length, DIM, generator=g)
    names = [n for n in CONFIGS if n != FFT or length <= args.fft_max_length]
    layers = {name: build(name, grid) for name in names}
    errors = None
    if length <= args.check_max_length:
        errors = {name: check_attention(layer, length) for name, layer in layers.items()}
        for name, err in errors.items():
            if not err <= 1e-4:
                raise SystemExit(f"correctness check failed: {name} at L={length}: {err:.3g}")
    fns = {name: train_step(layer, x, grad) for name, layer in layers.items()}
    memory = {name: peak_memory_bytes(fn) for name, fn in fns.items()}  # also warms up
    label = f"{image}x{image} patch {patch} (L={length})"
    rounds = args.rounds if length <= 1024 else args.long_rounds
    timed = interleaved_rounds(
        fns, rounds=rounds, seconds=args.seconds, log=lambda s: print(f"{label} {s}")
    )
    return {
        "image": image,
        "patch": patch,
        "grid": list(grid),
        "length": length,
        "seconds": timed.seconds,
        "round_seconds": timed.round_seconds,
        "repeats": timed.repeats,
        "memory_bytes": memory,
        "time_ratio": ratio_summary(timed.round_seconds),
        "fft_time_ratio": ratio_summary(timed.round_seconds, FFT) if FFT in layers else None,
        "memory_ratio": memory[SOFTMAX] / max(memory[KERNELIZED], 1),
        "kernelized_path": kernelized_path(layers[KERNELIZED], args.batch, length),
        "correctness_max_abs_error": errors,
    }


def notes(report: dict[str, Any], quick: bool) -> list[str]:
    checked = [r["length"] for r in report["rows"] if r["correctness_max_abs_error"]]
    worst = max(
        (e for r in report["rows"] if r["correctness_max_abs_error"]
         for e in r["correctness_max_abs_error"].values()),
        default=None,
    )  # fmt: skip
    load = report["load_average"]
    out = [
        '`nprf_rpe`: `kattn.build("nprf_rpe", rpe="toeplitz2d", grid=patch grid, '
        f"num_features={NUM_FEATURES})`: PRF features (M = {NUM_FEATURES}, as Luo et al. 2021, "
        "§4.4) of normalised queries and keys, weighted by exp(b[Δrow, Δcol]); the last column "
        'is the path its `rpe_method="auto"` took; `nprf_rpe fft` is the same block with '
        '`rpe_method="fft"`. `softmax`: kattn\'s softmax mechanism, '
        "PyTorch's `scaled_dot_product_attention`.",
        "Ratios are softmax over `nprf_rpe`: above 1, `nprf_rpe` is faster or smaller. The "
        "time ratio in brackets is its range over the rounds (the machine's noise).",
        "Peak memory: one forward + backward call (`kattn.bench.peak_memory_bytes`; on the CPU "
        "the profiler's tensor allocations), the input, its upstream gradient and the "
        "parameters made before excluded, the parameter gradients included.",
        "Correctness (attention against its dense reference, batch 1): checked at L = "
        + (", ".join(str(n) for n in checked) or "none")
        + (f", largest abs error {worst:.2g}." if worst is not None else "."),
        f"Load average (1, 5, 15 min) at the start {tuple(round(v, 2) for v in load['start'])}"
        f", at the end {tuple(round(v, 2) for v in load['end'])}.",
    ]
    skipped = [r["length"] for r in report["rows"] if r["fft_time_ratio"] is None]
    if skipped:
        cap = report["config"]["fft_max_length"]
        out.append(
            f"`nprf_rpe fft` not timed at L = {', '.join(str(n) for n in skipped)} (above "
            f"--fft-max-length {cap}): the 2-D FFT transforms B·H·M·Dv channels of the doubled "
            "grid, seconds per call at L = 256 on this CPU and growing with L (gigabytes of "
            "spectra at L = 4,096), which is why `auto` takes the exact blocked form here."
        )
    if quick:
        out.append("A `--quick` smoke run: small sizes and batch, one round; not a measurement.")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help="IMAGExPATCH pairs, comma-separated")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, L ≤ 1024")
    parser.add_argument("--long-rounds", type=int, default=3, help="rounds for L > 1024")
    parser.add_argument("--seconds", type=float, default=1.0, help="per candidate per round")
    parser.add_argument(
        "--check-max-length", type=int, default=1024, help="check the attention up to this L"
    )
    parser.add_argument(
        "--fft-max-length", type=int, default=256,
        help="time the forced FFT path up to this L (its B·H·M·Dv spectra of the doubled grid "
        "take seconds at L = 256 and grow with L)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="two small sizes, batch 2, 1 round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.batch, args.seconds = QUICK_SIZES, 2, 0.05
        args.rounds = args.long_rounds = 1
    args.sizes = parse_sizes(args.sizes)
    if min(args.batch, args.rounds, args.long_rounds) < 1:
        parser.error("--batch, --rounds and --long-rounds must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_start, start = os.getloadavg(), time.perf_counter()
    rows = [measure(image, patch, args) for image, patch in args.sizes]
    info = machine_info()
    configs = {name: options(name, (0, 0)) for name in CONFIGS}
    for name in (KERNELIZED, FFT):
        configs[name]["grid"] = "the patch grid of each size"
    report: dict[str, Any] = {
        "machine": info,
        "command": " ".join(["python", "benchmarks/vit_speed.py", *sys.argv[1:]]),
        "environment": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "config": {
            "block": "kattn.nn.EncoderLayer, pre-LN, training mode, dropout 0",
            "dim": DIM,
            "heads": HEADS,
            "head_dim": DIM // HEADS,
            "ffn_dim": FFN,
            "batch": args.batch,
            "dtype": "float32",
            "pass": "forward + backward",
            "sizes": [list(s) for s in args.sizes],
            "configs": configs,
            "rounds": f"{args.rounds} (L ≤ 1024), {args.long_rounds} (longer)",
            "seconds_per_round": args.seconds,
            "check_max_length": args.check_max_length,
            "fft_max_length": args.fft_max_length,
            "threads": torch.get_num_threads(),
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_seconds": time.perf_counter() - start,
        "rows": rows,
    }
    report["notes"] = notes(report, args.quick)
    write_run(args.out, "vit", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
