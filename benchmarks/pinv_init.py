"""Where Skyformer's pseudo-inverse iteration starts: approximation error and training stability.

Skyformer (Chen et al., NeurIPS 2021, §4.4) inverts the preconditioned core
``M = D^{-½}(C̄_{S,S} + γI)D^{-½}`` by six hyper-power steps and requires ``‖I − M‖ < 1``, the
condition of the iteration started from ``Z₀ = I`` (``pinv_init="identity"``). The released
code, like Nyströmformer's, starts from ``Z₀ = Mᵀ / max colsum`` over the whole batch
(``"global"``); ``"per_matrix"`` scales Mᵀ per matrix. For each start, one run measures:

* **approximation** (float64, eval landmarks, six steps): the relative Frobenius error of the
  iterate against ``torch.linalg.inv(M)``, and of the attention output against exact Gaussian
  attention (``gaussian``) and against Skyformer with the exact inverse (the iteration's own
  share); q, k, v iid ``N(0, 0.554²)`` (BERT-base initialisation scale, as ``kattn bench approx
  --experiment spectral``), D = 64, 4 heads, 128 landmarks; at L = 64 every row of [Q; K] is a
  landmark. Medians over heads × seeds.
* **training stability**: a small classifier (Skyformer's LRA model: 2 pre-LN layers, width 64,
  2 heads, mean pooling; 32 landmarks at L = 64, so they are sampled) learns to report the
  first token (it must attend to one position), AdamW at learning rate 1e-3 without gradient
  clipping, every start from the same weights on the same batches with the same landmark draws
  and dropout masks. Recorded per step: loss and gradient norm; reported: non-finite steps,
  median and largest gradient norm, the loss over the last 20 steps, held-out accuracy, the
  first step whose 20-step mean loss is below 1.5 (chance: ln 8 ≈ 2.08). And the instability
  score of ``kattn.bench.stability`` (Chen et al. 2021, Appendix F): mean over the first 20
  steps at the paper's early learning rate of ``τ_i / τ_i(softmax)``.

Results go to ``benchmarks/results/pinv-init-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/pinv_init.py            # the committed results (a few minutes on 2 cores)
    python benchmarks/pinv_init.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kattn
from kattn.bench import machine_info
from kattn.bench.script_results import write_run
from kattn.bench.spectral import BERT_INIT_STD
from kattn.bench.stability import LEARNING_RATE, MODEL, instability_scores
from kattn.functional.gaussian import gaussian_attention, gaussian_kernel
from kattn.functional.pinv import iterative_pinv
from kattn.nn.classifiers import SequenceClassifier

RESULTS = Path(__file__).resolve().parent / "results"
INITS = ("identity", "global", "per_matrix")
D, HEADS, LANDMARKS, ITERATIONS = 64, 4, 128, 6
#: the training task: BATCH sequences of LENGTH uniform tokens in [1, VOCAB), label = the first
#: token % CLASSES; TRAIN_LANDMARKS landmarks, AdamW at learning rate LR
BATCH, LENGTH, VOCAB, CLASSES, TRAIN_LANDMARKS, LR = 16, 64, 16, 8, 32, 1e-3
TASK = {"batch": BATCH, "length": LENGTH, "vocab": VOCAB, "classes": CLASSES,
        "landmarks": TRAIN_LANDMARKS, "lr": LR}  # fmt: skip
#: a 20-step mean loss below this counts as learning (chance is ln 8 ≈ 2.08)
LEARNED_LOSS = 1.5


def relative(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Relative Frobenius error of each ``(…, n, c)`` matrix of ``a`` against ``b``."""
    err = torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)
    return err.flatten().tolist()


def skyformer(length: int, seed: int, **options: Any) -> torch.nn.Module:
    """Skyformer in eval(); the same seed gives the same landmarks whatever the options."""
    torch.manual_seed(seed)
    options = {"num_landmarks": LANDMARKS, "pinv_iterations": ITERATIONS, **options}
    attn = kattn.build("skyformer", head_dim=D, num_heads=HEADS, max_len=length, **options)
    return attn.double().eval()


def preconditioned_core(attn: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``D^{-½}(C̄_{S,S} + γI)D^{-½}`` for the module's landmarks, ``(B, H, S, S)``."""
    index, _ = attn.landmarks(q.shape[0], q.shape[2], k.shape[2], None, q.device)
    x = torch.cat([q, k], dim=2)
    xs = x.gather(2, index[:, None, :, None].expand(*x.shape[:2], -1, x.shape[-1]))
    core = gaussian_kernel(xs, xs, scale=D**-0.25)
    core = core + attn.gamma * torch.eye(core.shape[-1], dtype=core.dtype)
    d_half = core.sum(dim=-1, keepdim=True).rsqrt()
    return d_half * core * d_half.mT


def approximation(lengths: list[int], seeds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for length in lengths:
        errors: dict[str, dict[str, list[float]]] = {
            i: {"inverse": [], "vs_gaussian": [], "vs_exact_inverse": []} for i in INITS
        }
        nystrom, smallest = [], []  # the exact inverse's error; the cores' smallest eigenvalue
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            q, k, v = (
                torch.randn(1, HEADS, length, D, generator=g, dtype=torch.float64) * BERT_INIT_STD
                for _ in range(3)
            )
            with torch.no_grad():
                exact = gaussian_attention(q, k, v)
                exact_inverse = skyformer(length, seed, pinv_iterations=None)
                solved = exact_inverse(q, k, v)
                core = preconditioned_core(exact_inverse, q, k)
                inverse = torch.linalg.inv(core)
                for init in INITS:
                    out = skyformer(length, seed, pinv_init=init)(q, k, v)
                    errors[init]["inverse"] += relative(
                        iterative_pinv(core, ITERATIONS, init=init), inverse
                    )
                    errors[init]["vs_gaussian"] += relative(out, exact)
                    errors[init]["vs_exact_inverse"] += relative(out, solved)
            nystrom += relative(solved, exact)
            smallest += torch.linalg.eigvalsh(core)[..., 0].flatten().tolist()
        for init in INITS:
            med = {name: statistics.median(e) for name, e in errors[init].items()}
            rows.append({"length": length, "init": init, **med, "samples": seeds * HEADS})
        rows.append({"length": length, "init": "exact inverse", "vs_gaussian":
                     statistics.median(nystrom), "median_smallest_eigenvalue":
                     statistics.median(smallest), "samples": seeds * HEADS})  # fmt: skip
    return rows


def task_batches(steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g)
        out.append((tokens, tokens[:, 0] % CLASSES))
    return out


def classifier(
    mechanism: str, seed: int, reference: SequenceClassifier | None = None, **options: Any
) -> Any:
    """The classifier; with ``reference``, every weight shared by name copied from it."""
    torch.manual_seed(seed)
    model = SequenceClassifier(VOCAB, LENGTH, CLASSES, mechanism=mechanism, **MODEL, **options)  # type: ignore[arg-type]
    if reference is not None:
        mine = model.state_dict()
        shared = {n: w for n, w in reference.state_dict().items() if n in mine}
        model.load_state_dict(shared, strict=False)
    return model


def train(model: SequenceClassifier, batches: list, seed: int) -> dict[str, Any]:
    """AdamW steps without clipping; the global RNG seeded per step (same landmark draws and
    dropout masks for every start). Non-finite steps are recorded and skipped."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms, bad = [], [], 0
    model.train()
    for step, (tokens, labels) in enumerate(batches):
        torch.manual_seed(1_000_003 * seed + step)
        loss = F.cross_entropy(model(tokens), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
        losses.append(float(loss.detach()))
        norms.append(norm)
        if not (math.isfinite(norm) and math.isfinite(losses[-1])):
            bad += 1
            continue
        optimiser.step()
    model.eval()
    held_out = task_batches(8, seed=10_000 + seed)
    with torch.no_grad():
        hits = sum(int((model(t).argmax(-1) == y).sum()) for t, y in held_out)
    window = 20
    means = [statistics.mean(losses[i - window : i]) for i in range(window, len(losses) + 1)]
    learned = next((i + window for i, m in enumerate(means) if m < LEARNED_LOSS), None)
    return {
        "losses": losses, "grad_norms": norms, "non_finite_steps": bad,
        "final_loss": statistics.mean(losses[-window:]),
        "accuracy": hits / (len(held_out) * BATCH), "steps_to_learned_loss": learned,
    }  # fmt: skip


def stability(steps: int, seeds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {init: [] for init in INITS}
    tau: dict[str, list[float]] = {init: [] for init in INITS}
    options = {"num_landmarks": TRAIN_LANDMARKS, "pinv_iterations": ITERATIONS}
    for seed in range(seeds):
        print(f"training, seed {seed}", flush=True)
        batches = task_batches(steps, seed)
        softmax = classifier("softmax", seed)
        start = {n: w.clone() for n, w in softmax.state_dict().items()}
        base = instability_scores(softmax, batches[:20], lr=LEARNING_RATE, seed=seed)
        softmax.load_state_dict(start)
        for init in INITS:
            model = classifier("skyformer", seed, softmax, pinv_init=init, **options)
            scores = instability_scores(model, batches[:20], lr=LEARNING_RATE, seed=seed)
            tau[init].append(statistics.mean(s / b for s, b in zip(scores, base, strict=True)))
            model = classifier("skyformer", seed, softmax, pinv_init=init, **options)
            runs[init].append(train(model, batches, seed))
    summary = {}
    for init in INITS:
        mine = runs[init]
        norms = [n for r in mine for n in r["grad_norms"]]
        reached = [r["steps_to_learned_loss"] for r in mine]
        summary[init] = {
            "non_finite_steps": sum(r["non_finite_steps"] for r in mine),
            "median_grad_norm": statistics.median(norms), "max_grad_norm": max(norms),
            "final_loss": statistics.median(r["final_loss"] for r in mine),
            "accuracy": statistics.median(r["accuracy"] for r in mine),
            "steps_to_learned_loss": reached,
            "tau_ratio_to_softmax": statistics.mean(tau[init]), "tau_per_seed": tau[init],
        }  # fmt: skip
    return {"summary": summary, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the approximation part")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--train-seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one short length, 20 steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.seeds, args.steps, args.train_seeds = "64", 1, 20, 1
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print("approximation", flush=True)
    start = time.perf_counter()
    approx = approximation([int(x) for x in args.lengths.split(",")], args.seeds)
    middle = time.perf_counter()
    train_report = stability(args.steps, args.train_seeds)
    seconds = {"approximation": middle - start, "training": time.perf_counter() - middle}
    info = machine_info()
    report = {
        "machine": info,
        "config": {
            "head_dim": D, "heads": HEADS, "landmarks": LANDMARKS, "iterations": ITERATIONS,
            "input_std": BERT_INIT_STD, "approximation_seeds": args.seeds,
            "task": TASK, "model": MODEL, "steps": args.steps, "train_seeds": args.train_seeds,
            "tau_learning_rate": LEARNING_RATE, "learned_loss": LEARNED_LOSS,
        },
        "wall_seconds": seconds,
        "approximation": approx,
        "training": train_report,
    }  # fmt: skip
    write_run(args.out, "pinv-init", report, render(report), quick=args.quick)


def render(report: dict[str, Any]) -> str:
    info, cfg = report["machine"], report["config"]
    lines = [
        "# Skyformer's pseudo-inverse start: identity, global, per_matrix",
        "",
        f"{info['processor']}, {info['torch_threads']} threads; torch {info['torch']}, "
        f"kattn {info['kattn']}. Made by `benchmarks/pinv_init.py` in "
        f"{sum(report['wall_seconds'].values()):.0f} s.",
        "",
        f"## Approximation ({cfg['iterations']} steps, {cfg['landmarks']} landmarks, D = "
        f"{cfg['head_dim']}, float64; medians over {cfg['heads']} heads × "
        f"{cfg['approximation_seeds']} seeds)",
        "",
        "| L | start | inverse error | output vs gaussian | output vs exact inverse |",
        "|---|---|---|---|---|",
    ]
    for r in report["approximation"]:
        if r["init"] == "exact inverse":
            lines.append(
                f"| {r['length']} | exact inverse (smallest eigenvalue of M: "
                f"{r['median_smallest_eigenvalue']:.3g}) | 0 | {r['vs_gaussian']:.4f} | 0 |"
            )
            continue
        lines.append(
            f"| {r['length']} | {r['init']} | {r['inverse']:.3g} | {r['vs_gaussian']:.4f} | "
            f"{r['vs_exact_inverse']:.3g} |"
        )
    task = cfg["task"]
    lines += [
        "",
        f"## Training ({cfg['steps']} AdamW steps at lr {task['lr']:g}, no clipping, "
        f"{cfg['train_seeds']} seeds; B = {task['batch']}, L = {task['length']}, "
        f"{task['landmarks']} landmarks; first-token task)",
        "",
        "| start | non-finite steps | median grad norm | max grad norm | loss, last 20 steps | "
        f"held-out accuracy | steps to loss < {cfg['learned_loss']:g} | τ / τ(softmax), first 20 "
        "steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for init, s in report["training"]["summary"].items():
        reached = ", ".join("never" if x is None else str(x) for x in s["steps_to_learned_loss"])
        lines.append(
            f"| {init} | {s['non_finite_steps']} | {s['median_grad_norm']:.3g} | "
            f"{s['max_grad_norm']:.3g} | {s['final_loss']:.3f} | {s['accuracy']:.3f} | "
            f"{reached} | {s['tau_ratio_to_softmax']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
