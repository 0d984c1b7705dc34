"""Speed and peak memory of the learned-kernel mechanisms against softmax attention on the CPU.

One run on one machine: B=1, H=1, D=Dv=64, each mechanism with its default M (the KL-Transformer's
Table 5 for the spectral maps; the head dim for the feed-forward kernels), fp32, forward +
backward of a training step (``(out · grad).sum() + attn.regularization_loss()``, so the
redraw schedules, the autoencoders' reconstruction losses and the orthogonality penalties are
included), at L = 4096 (the target length; ``--lengths`` adds others). ``softmax`` is the
library's exact softmax, PyTorch's fused ``scaled_dot_product_attention``.

Times are medians of interleaved rounds (``kattn.bench.interleaved_rounds``); peak memory is the
peak of tracked tensor allocations during one call (inputs excluded). Before timing, every
mechanism is checked against an explicit reference on its own features (float64, L=256).
Results go to ``benchmarks/results/learned-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/learned_speed.py            # the committed results
    python benchmarks/learned_speed.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

import kattn
from kattn.bench import interleaved_rounds, machine_info, peak_memory_bytes
from kattn.bench.script_results import machine_line, write_run
from kattn.functional import linear_attention_reference
from kattn.functional.simpletron import simpletron_attention_reference

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D = 1, 1, 64
SPECTRAL = (
    "gmm_rks",
    "gmm_prf",
    "fastfood_rks",
    "fastfood_prf",
    "generative_rks",
    "generative_prf",
)
FEEDFORWARD = ("ffk_linear", "ffk_fcnn", "ffk_glu", "ffk_oglu", "ffk_aoglu", "ffk_ae", "ffk_vae")
LEARNED = (*SPECTRAL, *FEEDFORWARD, "simpletron")
TARGET_LENGTH = 4096


def build(name: str) -> kattn.Attention:
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=H)


def inputs(
    length: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(B, H, length, D, generator=g, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def step(attn: kattn.Attention, q, k, v, grad) -> Callable[[], None]:
    """A training step's attention: forward, the penalty, backward; fresh gradients each call."""
    attn.train()

    def run() -> None:
        q.grad = k.grad = v.grad = None
        attn.zero_grad(set_to_none=True)
        ((attn(q, k, v) * grad).sum() + attn.regularization_loss()).backward()

    return run


def reference(attn: kattn.Attention, q, k, v, causal: bool) -> torch.Tensor:
    """The explicit (L, L) form of ``attn`` on its own features."""
    if isinstance(attn, kattn.attention.KernelizedAttention):
        fq, fk = attn.features(q).dense(), attn.features(k).dense()
        return linear_attention_reference(fq, fk, v, causal=causal, eps=attn.eps)
    return simpletron_attention_reference(q, k, v, causal=causal)


def check_correctness(length: int = 256) -> dict[str, float]:
    """Each mechanism (eval, float64) against its explicit reference: the largest relative
    error of the output and of the input gradients over the causal and non-causal forms."""
    errors = {}
    for name in LEARNED:
        attn = build(name).double().eval()
        worst = 0.0
        for causal in (False, True):
            q, k, v, grad = (x.double() for x in inputs(length, seed=1, dtype=torch.float64))
            results = []
            for out in (attn(q, k, v, causal=causal), reference(attn, q, k, v, causal)):
                grads = torch.autograd.grad((out * grad).sum(), (q, k, v))
                results.append(torch.cat([out.flatten(), *(g.flatten() for g in grads)]))
            fast, slow = results
            worst = max(worst, float((fast - slow).norm() / slow.norm()))
        errors[name] = worst
        if worst > 1e-6:
            raise SystemExit(f"correctness check failed: {name} relative error {worst:.3g}")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default=str(TARGET_LENGTH))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per candidate per round")
    parser.add_argument("--quick", action="store_true", help="L=512, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.seconds = "512", 2, 0.05
    correctness = check_correctness()
    seconds, round_seconds, memory, features = {}, {}, {}, {}
    for length in (int(x) for x in args.lengths.split(",")):
        q, k, v, grad = inputs(length)
        modules = {name: build(name) for name in ("softmax", *LEARNED)}
        fns = {name: step(attn, q, k, v, grad) for name, attn in modules.items()}
        print(f"L={length}", flush=True)
        timed = interleaved_rounds(fns, rounds=args.rounds, seconds=args.seconds)
        seconds[length], round_seconds[length] = timed.seconds, timed.round_seconds
        memory[length] = {name: peak_memory_bytes(fn) for name, fn in fns.items()}
        features = {
            name: attn.feature_map.num_features if hasattr(attn, "feature_map") else D
            for name, attn in modules.items()
        }
    report = {
        "machine": machine_info(),
        "config": {
            "batch": B,
            "heads": H,
            "head_dim": D,
            "value_dim": D,
            "dtype": "float32",
            "pass": "forward+backward (training mode, regularization_loss included)",
            "rounds": args.rounds,
        },
        "features": features,
        "correctness": correctness,
        "seconds": seconds,
        "round_seconds": round_seconds,
        "peak_memory_bytes": memory,
        "target": {"length": TARGET_LENGTH, "each_faster_than": "softmax"},
    }
    write_run(args.out, "learned", report, render(report), quick=args.quick)


def render(report: dict) -> str:
    info, cfg = report["machine"], report["config"]
    lines = [
        "# Learned kernels and SimpleTRON against softmax attention on the CPU",
        "",
        machine_line(info),
        f"B={cfg['batch']}, H={cfg['heads']}, D=Dv={cfg['head_dim']}, fp32, {cfg['pass']}. "
        f"Medians of {cfg['rounds']} interleaved rounds (per-round speed-up range in brackets); "
        "peak memory of tracked tensor allocations during one call. `softmax` is PyTorch's "
        "fused scaled_dot_product_attention. Features: the width of φ (default M).",
        "",
    ]
    for length, row in report["seconds"].items():
        base = row["softmax"]
        rounds = report["round_seconds"][length]
        lines += [
            f"## L = {length}",
            "",
            "| mechanism | features | time (ms) | speed-up vs softmax | peak memory (MiB) |",
            "|---|---|---|---|---|",
        ]
        for name, sec in row.items():
            per_round = [a / b for a, b in zip(rounds["softmax"], rounds[name], strict=True)]
            spread = f" [{min(per_round):.1f}–{max(per_round):.1f}]" if name != "softmax" else ""
            mib = report["peak_memory_bytes"][length][name] / 2**20
            lines.append(
                f"| `{name}` | {report['features'][name]} | {sec * 1e3:.1f} | "
                f"{base / sec:.2f}×{spread} | {mib:.1f} |"
            )
        lines.append("")
        if int(length) == TARGET_LENGTH:
            slower = [n for n, s in row.items() if n != "softmax" and s >= base]
            verdict = (
                "every mechanism is faster than softmax" if not slower else f"slower: {slower}"
            )
            lines += [f"Target at L = {TARGET_LENGTH}: {verdict}.", ""]
    lines += ["Correctness before timing (largest relative error, float64, L=256):", ""]
    lines += [f"- `{n}`: {e:.1e}" for n, e in report["correctness"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
