"""Speed and peak memory of the Nyström family against softmax attention on the CPU.

One run on one machine: B=1, H=2, D=Dv=32, 128 landmarks (Skyformer, Nyströmformer), fp32,
forward + backward (a training step's attention), lengths 1024–8192. Two softmax baselines:

* ``softmax``: the library's exact softmax, PyTorch's fused ``scaled_dot_product_attention``
  (on the CPU a flash-style kernel: O(L) memory);
* ``softmax (materialised)``: ``softmax(QKᵀ/√D) V`` with the (L, L) weights as a tensor, the
  standard attention that the papers measure against.

``linformer`` (k = 128) and ``performer`` (M = 128) are timed alongside for context. Times are
medians of interleaved rounds (``kattn.bench.interleaved_rounds``); peak memory is the peak of
tracked tensor allocations during one call (inputs excluded). Before timing, each fast path is
checked against its explicit reference. Results go to ``benchmarks/results/nystrom-<machine>-
torch<version>-kattn<version>.{json,md}``.

    python benchmarks/nystrom_speed.py            # the committed results
    python benchmarks/nystrom_speed.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

import kattn
from kattn.bench import interleaved_rounds, machine_info, peak_memory_bytes
from kattn.bench.script_results import machine_line, write_run
from kattn.functional.nystrom import nystromformer_attention_reference
from kattn.functional.softmax import softmax_attention_reference

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D, LANDMARKS = 1, 2, 32, 128
MATERIALISED = "softmax (materialised)"
MECHANISMS = ("softmax", MATERIALISED, "skyformer", "nystromformer", "linformer", "performer")
TARGET_LENGTH, TARGET_SPEEDUP, TARGET_MEMORY = 4096, 5.0, 0.5


class Materialised(torch.nn.Module):
    def forward(self, q, k, v):
        return softmax_attention_reference(q, k, v)


def build(name: str, max_len: int) -> torch.nn.Module:
    """Mechanism ``name`` with its registered size option (landmarks, projected rows,
    features) at ``LANDMARKS``."""
    torch.manual_seed(0)
    if name == MATERIALISED:
        return Materialised()
    size = kattn.spec(name).size_option
    options = {size: LANDMARKS} if size else {}
    return kattn.build(name, head_dim=D, num_heads=H, max_len=max_len, **options)


def inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(B, H, length, D, generator=g) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def step(attn: torch.nn.Module, q, k, v, grad) -> Callable[[], None]:
    """Forward and backward, fresh gradients each call (as for activations in training)."""

    def run() -> None:
        q.grad = k.grad = v.grad = None
        attn(q, k, v).backward(grad)

    return run


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _dense_skyformer(sky, q, k, v):  # type: ignore[no-untyped-def]
    """C̄_{Q,S} (C̄_{S,S} + γI)^{-1} C̄_{S,K} V with explicit matrices (the module's landmarks)."""
    length = q.shape[2]
    index, _ = sky.landmarks(B, length, length, None, q.device)
    x = torch.cat([q, k], dim=2) * D**-0.25
    xs = x[:, :, index[0]]
    kernel = lambda a, b: torch.exp(-0.5 * torch.cdist(a, b).square())  # noqa: E731
    core = kernel(xs, xs) + sky.gamma * torch.eye(LANDMARKS)
    return kernel(x[:, :, :length], xs) @ torch.linalg.solve(core, kernel(xs, x[:, :, length:]) @ v)


def check_correctness(length: int = 1024) -> dict[str, float]:
    """The fused paths against their explicit references, outputs and input gradients
    (relative errors; eval: fixed landmarks)."""
    q, k, v, grad = inputs(length, seed=1)
    sky = build("skyformer", length).eval()
    pairs = {
        "softmax": (build("softmax", length), softmax_attention_reference),
        "nystromformer": (
            build("nystromformer", length),
            lambda q, k, v: nystromformer_attention_reference(q, k, v, LANDMARKS),
        ),
        "skyformer": (sky, lambda q, k, v: _dense_skyformer(sky, q, k, v)),
    }
    errors = {}
    for name, (fast, reference) in pairs.items():
        outs, grads = [], []
        for fn in (fast, reference):
            q.grad = k.grad = v.grad = None
            out = fn(q, k, v)
            out.backward(grad)
            outs.append(out.detach())
            grads.append(torch.cat([x.grad.flatten() for x in (q, k, v)]))
        errors[name] = _relative(*outs)
        errors[f"{name} gradients"] = _relative(*grads)
    for name, err in errors.items():
        if err > 1e-3:
            raise SystemExit(f"correctness check failed: {name} relative error {err:.3g}")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per candidate per round")
    parser.add_argument("--quick", action="store_true", help="short lengths, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.seconds = "256,512", 2, 0.05
    lengths = [int(x) for x in args.lengths.split(",")]
    check_length = min(1024, *lengths)
    correctness = check_correctness(check_length)
    seconds, round_seconds, memory = {}, {}, {}
    for length in lengths:
        q, k, v, grad = inputs(length)
        fns = {name: step(build(name, length), q, k, v, grad) for name in MECHANISMS}
        print(f"L={length}", flush=True)
        timed = interleaved_rounds(fns, rounds=args.rounds, seconds=args.seconds)
        seconds[length], round_seconds[length] = timed.seconds, timed.round_seconds
        memory[length] = {name: peak_memory_bytes(fn) for name, fn in fns.items()}
    report = {
        "machine": machine_info(),
        "config": {
            "batch": B,
            "heads": H,
            "head_dim": D,
            "value_dim": D,
            "landmarks": LANDMARKS,
            "dtype": "float32",
            "pass": "forward+backward",
            "mode": "training (landmarks redrawn each call)",
            "rounds": args.rounds,
        },
        "correctness": correctness,
        "correctness_length": check_length,
        "seconds": seconds,
        "round_seconds": round_seconds,
        "peak_memory_bytes": memory,
        "targets": {
            "length": TARGET_LENGTH,
            "speedup_at_least": TARGET_SPEEDUP,
            "memory_ratio_at_most": TARGET_MEMORY,
        },
    }
    write_run(args.out, "nystrom", report, render(report), quick=args.quick)


def render(report: dict) -> str:
    info, cfg = report["machine"], report["config"]
    lines = [
        "# The Nyström family against softmax attention on the CPU",
        "",
        machine_line(info),
        f"B={cfg['batch']}, H={cfg['heads']}, D=Dv={cfg['head_dim']}, {cfg['landmarks']} "
        "landmarks / projected length / features, fp32, forward + backward in training mode. "
        f"Medians of {cfg['rounds']} interleaved rounds; peak memory of tracked tensor "
        "allocations during one call. `softmax` is PyTorch's fused scaled_dot_product_attention "
        "(a flash-style kernel on the CPU, O(L) memory); `softmax (materialised)` forms the "
        "(L, L) weights, as the standard attention of the papers.",
        "",
    ]
    seconds, memory = report["seconds"], report["peak_memory_bytes"]
    names = list(next(iter(seconds.values())))
    lines += ["| L | " + " | ".join(f"{n} (ms)" for n in names) + " |"]
    lines += ["|---|" + "---|" * len(names)]
    for length, row in seconds.items():
        lines.append(f"| {length} | " + " | ".join(f"{row[n] * 1e3:.1f}" for n in names) + " |")
    lines += ["", "Peak memory (MiB):", ""]
    lines += ["| L | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for length, row in memory.items():
        lines.append(f"| {length} | " + " | ".join(f"{row[n] / 2**20:.1f}" for n in names) + " |")
    lines += ["", "Speed-up and memory ratio against each softmax baseline:", ""]
    header = "| L | mechanism | speed-up vs softmax | per-round range | vs materialised |"
    lines += [header + " memory / softmax | memory / materialised |", "|---|" + "---|" * 6]
    for length, row in seconds.items():
        rounds, mem = report["round_seconds"][length], memory[length]
        for name in names:
            if name.startswith("softmax"):
                continue
            per_round = [s / a for s, a in zip(rounds["softmax"], rounds[name], strict=True)]
            lines.append(
                f"| {length} | {name} | {row['softmax'] / row[name]:.2f}× | "
                f"{min(per_round):.1f}–{max(per_round):.1f}× | "
                f"{row[MATERIALISED] / row[name]:.1f}× | {mem[name] / mem['softmax']:.2f} | "
                f"{mem[name] / mem[MATERIALISED]:.3f} |"
            )
    target = report["targets"]
    length = str(target["length"]) if str(target["length"]) in seconds else target["length"]
    if length in seconds:
        row, mem = seconds[length], memory[length]
        lines += ["", f"Targets at L = {length}: speed-up ≥ {target['speedup_at_least']:g}× and "
                  f"peak memory ≤ {target['memory_ratio_at_most']:g}× of softmax.", ""]  # fmt: skip
        lines += ["| mechanism | baseline | speed-up | met | memory ratio | met |"]
        lines += ["|---|---|---|---|---|---|"]
        for name in ("skyformer", "nystromformer"):
            for base in ("softmax", MATERIALISED):
                speed, ratio = row[base] / row[name], mem[name] / mem[base]
                lines.append(
                    f"| {name} | {base} | {speed:.2f}× | "
                    f"{'yes' if speed >= target['speedup_at_least'] else 'NO'} | {ratio:.3f} | "
                    f"{'yes' if ratio <= target['memory_ratio_at_most'] else 'NO'} |"
                )
    errors = ", ".join(f"{k} {v:.1e}" for k, v in report["correctness"].items())
    at = report["correctness_length"]
    lines += ["", f"Checked first against the explicit references (L={at}): {errors}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
