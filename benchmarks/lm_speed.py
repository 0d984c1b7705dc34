"""Speed of a causal language model (``kattn.nn.CausalLM``) on the CPU (or ``--device cuda``):
decoding and training.

One model shape for every mechanism: vocabulary 256 (bytes), dim 256, depth 4, 4 heads, FFN
1024, sinusoidal positions, no dropout, fp32, ``torch.manual_seed(0)`` before building. Candidates:
``softmax`` (key/value cache, ``scaled_dot_product_attention``), ``performer`` (256 PRF
features), ``performer`` with M=64 and ``nprf_rpe`` with ``rpe="decay"`` and M=64 (constant-time
decoding with relative positions).

* Decoding, ``torch.inference_mode()``: for each batch size B and context, the prompt is read by
  ``prefill`` (timed once), then ``step`` calls continue its state; the time of one step (one
  new token for each of the B sequences) is the median of interleaved rounds' medians. The
  decoding state's size is recorded, for the key/value cache both filled and allocated.
* Training: one AdamW step (forward, cross-entropy, backward, step) over a fixed number of
  tokens per step at several block sizes, in interleaved rounds after one warm-up step, beside
  a "no attention" ceiling: the same model whose attention returns ``v`` unchanged, the cost of
  everything but attention, which bounds the speed-up of any mechanism.

Logits of ``prefill`` + ``step`` are checked against the parallel forward before timing.
Results go to ``benchmarks/results/lm-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/lm_speed.py            # the committed results
    python benchmarks/lm_speed.py --quick    # a smoke run
    python benchmarks/lm_speed.py --device cuda   # on a GPU (results named by the GPU)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kattn.attention.softmax import KVCache
from kattn.bench import machine_info, measure_time, results_stem, write_results
from kattn.bench.timing import tensors_in
from kattn.nn import CausalLM
from lm_speed_report import CEILING, render

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB = 256
SHAPE = {"dim": 256, "depth": 4, "num_heads": 4, "ffn_dim": 1024}
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "softmax": ("softmax", {}),
    "performer": ("performer", {}),
    "performer M=64": ("performer", {"num_features": 64}),
    "nprf_rpe decay M=64": ("nprf_rpe", {"rpe": "decay", "num_features": 64}),
}
LONG, SHORT, TRAIN_BLOCK = 8192, 512, 4096  # where the targets are read (if measured)


class PassThrough(nn.Module):
    """Attention replaced by the identity on the values: what the rest of the model costs."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool = False, key_padding_mask=None):
        return v


def build(name: str, max_len: int, device: str = "cpu") -> CausalLM:
    mechanism, options = CANDIDATES.get(name, ("softmax", {}))
    torch.manual_seed(0)
    model = CausalLM(
        VOCAB,
        max_len,
        **SHAPE,
        mechanism=mechanism,
        positions="sinusoidal",
        dropout=0.0,
        **options,
    )
    if name == CEILING:
        for layer in model.layers:
            layer.attn.attention = PassThrough()  # type: ignore[union-attr]
    return model.to(device)


def random_tokens(*shape: int, seed: int, device: str = "cpu") -> Tensor:
    tokens = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))
    return tokens.to(device)


def synchronize(device: str) -> None:
    """Wait for the device's queued work (before reading a clock)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def check_decoding(models: dict[str, CausalLM], prompt: int = 24, steps: int = 8) -> dict:
    """Logits of ``prefill`` then ``step`` equal those of the parallel forward."""
    device = str(next(next(iter(models.values())).parameters()).device)
    tokens = random_tokens(2, prompt + steps, seed=1, device=device)
    errors = {}
    with torch.inference_mode():
        for name, model in models.items():
            expected = model.eval()(tokens)
            logits, state = model.prefill(tokens[:, :prompt])
            rows = [logits]
            for t in range(prompt, prompt + steps):
                last, state = model.step(tokens[:, t], state)
                rows.append(last[:, None])
            errors[name] = float((torch.cat(rows, dim=1) - expected).abs().max())
    for name, err in errors.items():
        if not err <= 1e-4:
            raise SystemExit(f"correctness check failed: {name} decoding differs by {err:.3g}")
    return errors


def state_bytes(state: Any) -> tuple[int, int]:
    """Bytes of a decoding state: (filled, allocated); they differ for a key/value cache only,
    whose buffers have spare capacity beyond its ``length``."""
    filled = allocated = 0
    for layer in state.layers:
        size = sum(t.numel() * t.element_size() for t in tensors_in(layer))
        allocated += size
        if isinstance(layer, KVCache):
            used = (layer.keys[:, :, : layer.length], layer.values[:, :, : layer.length])
            size = sum(t.numel() * t.element_size() for t in used)
        filled += size
    return filled, allocated


def measure_decoding(models, batch: int, context: int, args) -> list[dict]:
    """Prefill ``context`` tokens for every model, then time ``step`` in interleaved rounds."""
    prompt = random_tokens(batch, context, seed=context + batch, device=args.device)
    token = random_tokens(batch, seed=2, device=args.device)
    states, prefill = {}, {}
    for name, model in models.items():
        synchronize(args.device)
        start = time.perf_counter()
        _, states[name] = model.prefill(prompt)
        synchronize(args.device)
        prefill[name] = time.perf_counter() - start

    def stepper(name: str):
        def step() -> None:
            states[name] = models[name].step(token, states[name])[1]

        return step

    fns = {name: stepper(name) for name in models}
    per_round: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.rounds):
        for name, fn in fns.items():  # first round warms up (the cache grows once there)
            timing = measure_time(
                fn, repeats=args.steps, warmup=2 if r == 0 else 0, device=args.device
            )
            per_round[name].append(timing.median)
        print(
            f"decode B={batch} context={context} round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {s[-1] * 1e3:.2f} ms" for n, s in per_round.items()),
            flush=True,
        )
    rows = []
    for name in models:
        seconds = statistics.median(per_round[name])
        filled, allocated = state_bytes(states[name])
        rows.append(
            {
                "batch": batch,
                "context": context,
                "mechanism": name,
                "step_seconds": seconds,
                "round_step_seconds": per_round[name],
                "tokens_per_second": batch / seconds,
                "prefill_seconds": prefill[name],
                "state_bytes_filled": filled,
                "state_bytes_allocated": allocated,
                "final_position": states[name].position,
            }
        )
    return rows


def measure_training(models, block: int, tokens: int, args) -> list[dict]:
    """AdamW steps over ``tokens`` tokens (batch = tokens // block) in interleaved rounds."""
    batch = max(1, tokens // block)
    data = random_tokens(batch, block + 1, seed=block, device=args.device)
    inputs, targets = data[:, :-1], data[:, 1:].flatten()
    losses: dict[str, float] = {}

    def trainer(name: str, optimizer: torch.optim.Optimizer):
        model = models[name]

        def step() -> None:
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[name] = float(loss.detach())

        return step

    fns = {}
    for name, model in models.items():
        model.train()
        fns[name] = trainer(name, torch.optim.AdamW(model.parameters(), lr=1e-4))
        fns[name]()  # warm-up
    per_round: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.train_rounds):
        for name, fn in fns.items():
            timing = measure_time(fn, repeats=args.train_steps, warmup=0, device=args.device)
            per_round[name].append(timing.median)
        print(
            f"train block={block} round {r + 1}/{args.train_rounds}: "
            + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in per_round.items()),
            flush=True,
        )
    rows = []
    for name in models:
        seconds = statistics.median(per_round[name])
        rows.append(
            {
                "block": block,
                "batch": batch,
                "mechanism": name,
                "step_seconds": seconds,
                "round_step_seconds": per_round[name],
                "tokens_per_second": batch * block / seconds,
                "last_loss": losses[name],
            }
        )
    return rows


def _ratio(num: dict, den: dict) -> tuple[float, list[float]]:
    """``num``'s step time over ``den``'s, and the same per round."""
    rounds = [
        a / b for a, b in zip(num["round_step_seconds"], den["round_step_seconds"], strict=True)
    ]
    return num["step_seconds"] / den["step_seconds"], rounds


def targets(report: dict) -> list[dict]:
    """The ratios the language-model issue asks for, at the sizes nearest to them measured."""
    decode, train = report["decode"], report["train"]
    contexts = sorted({r["context"] for r in decode})
    long = LONG if LONG in contexts else contexts[-1]
    short = SHORT if SHORT in contexts else contexts[0]
    blocks = sorted({r["block"] for r in train})
    block = TRAIN_BLOCK if TRAIN_BLOCK in blocks else blocks[-1]

    def row(rows: list[dict], **where) -> dict:
        return next(r for r in rows if all(r[k] == v for k, v in where.items()))

    out = []

    def add(name: str, pair: tuple[float, list[float]], low=None, high=None, bound=None) -> None:
        value, rounds = pair
        met = (low is None or value >= low) and (high is None or value <= high)
        out.append({"name": name, "value": value, "rounds": rounds, "min": low, "max": high,
                    "bound": bound, "met": met})  # fmt: skip

    for batch in sorted({r["batch"] for r in decode}):
        soft = row(decode, batch=batch, context=long, mechanism="softmax")
        perf = row(decode, batch=batch, context=long, mechanism="performer")
        perf_short = row(decode, batch=batch, context=short, mechanism="performer")
        add(f"decode B={batch}: softmax / performer at context {long}", _ratio(soft, perf), 10.0)
        add(
            f"decode B={batch}: performer at {long} / at {short}",
            _ratio(perf, perf_short),
            None,
            1.5,
        )
    soft = row(train, block=block, mechanism="softmax")
    bound = _ratio(soft, row(train, block=block, mechanism=CEILING))[0]
    for name in ("performer", "performer M=64"):
        pair = _ratio(soft, row(train, block=block, mechanism=name))
        add(f"train: {name} / softmax tokens/s at block {block}", pair, 3.0, bound=bound)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode-batches", default="1,16")
    parser.add_argument("--contexts", default="512,2048,8192")
    parser.add_argument("--rounds", type=int, default=5, help="decoding rounds")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per candidate/round")
    parser.add_argument("--blocks", default="1024,4096,8192")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per training step")
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=1, help="per candidate and round")
    parser.add_argument("--quick", action="store_true", help="short contexts, small steps")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    if args.quick:
        args.decode_batches, args.contexts, args.blocks = "1", "128,256", "256,512"
        args.tokens, args.rounds, args.steps, args.train_rounds = 1024, 2, 8, 1
    batches = [int(x) for x in args.decode_batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    blocks = [int(x) for x in args.blocks.split(",")]
    load_start = os.getloadavg()  # other work on the machine shows here
    max_len = max(*contexts, *blocks) + 1024
    models = {name: build(name, max_len, args.device) for name in CANDIDATES}
    correctness = check_decoding(models)
    decode = []
    with torch.inference_mode():
        for batch in batches:
            for context in contexts:
                decode += measure_decoding(models, batch, context, args)
    models[CEILING] = build(CEILING, max_len, args.device)
    train = []
    for block in blocks:
        train += measure_training(models, block, args.tokens, args)
    info = machine_info(args.device)
    report = {
        "machine": info,
        "config": {
            "vocab_size": VOCAB,
            **SHAPE,
            "positions": "sinusoidal",
            "dtype": "float32",
            "parameters": sum(p.numel() for p in models["softmax"].parameters()),
            "candidates": {k: {"mechanism": m, **o} for k, (m, o) in CANDIDATES.items()},
            "decode_rounds": args.rounds,
            "decode_steps_per_round": args.steps,
            "train_tokens_per_step": args.tokens,
            "train_rounds": args.train_rounds,
            "train_steps_per_round": args.train_steps,
            "optimizer": "AdamW(lr=1e-4)",
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "correctness_max_abs_error": correctness,
        "decode": decode,
        "train": train,
    }
    report["targets"] = targets(report)
    stem = results_stem("lm", info, torch.device(args.device).type)
    stem += "-quick" if args.quick else ""
    write_results(args.out, stem, report, render(report))


if __name__ == "__main__":
    main()
