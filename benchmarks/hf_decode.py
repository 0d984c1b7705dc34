"""Decode time per token of Hugging Face models running kattn mechanisms (kattn.hf).

A tiny GPT-2 and a tiny Llama (random weights, made here and saved with ``save_pretrained``
into a temporary folder: nothing is downloaded) are loaded back with
``attn_implementation`` = ``kattn:performer`` (from the plain checkpoint: fresh random
features), ``kattn:nprf_rpe`` (a checkpoint saved by ``kattn.hf.use(..., rpe="decay")``,
whose config records the decay RPE) and transformers' ``sdpa`` (softmax with its growing
key/value cache). Each generates 100 tokens greedily (``model.generate``); then, at each
context length, the time of single-token steps is measured: ``--rounds`` rounds interleaved
over the models, each reading a fresh prompt of that length into the cache ``generate`` would
use (not timed) and timing ``--steps`` steps after it, the median per token reported. The
recurrent mechanisms keep a state of constant size, so their time per token should not grow
with the context; softmax's does.

Results go to ``benchmarks/results/hf/hf-decode-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/hf_decode.py --threads 1          # the full run (a quiet machine)
    python benchmarks/hf_decode.py --quick --out /tmp/x  # the smoke test's run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import kattn.hf
from kattn.bench import machine_info
from kattn.bench.script_results import write_run

RESULTS = Path(__file__).resolve().parent / "results" / "hf"
FAMILIES = ("gpt2", "llama")
IMPLEMENTATIONS = ("sdpa", "kattn:performer", "kattn:nprf_rpe")
SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "vocab": 1000, "max_positions": 8192}


def tiny_model(family: str) -> Any:
    """A seeded random model of ``family`` with :data:`SHAPE`."""
    import transformers as t

    torch.manual_seed(0)
    h, n, heads, vocab, positions = (SHAPE[k] for k in SHAPE)
    if family == "gpt2":
        config = t.GPT2Config(
            vocab_size=vocab, n_embd=h, n_layer=n, n_head=heads, n_positions=positions
        )
        return t.GPT2LMHeadModel(config)
    config = t.LlamaConfig(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=4 * h,
        num_hidden_layers=n,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=positions,
    )
    return t.LlamaForCausalLM(config)


def save_checkpoints(folder: Path) -> dict[str, Path]:
    """Per family, a plain checkpoint and one saved with nprf_rpe (decay RPE)."""
    paths = {}
    for family in FAMILIES:
        tiny_model(family).save_pretrained(folder / family)
        with_rpe = kattn.hf.use(tiny_model(family), "nprf_rpe", rpe="decay", num_features=64)
        with_rpe.save_pretrained(folder / f"{family}-nprf_rpe")
        paths[family], paths[f"{family}-nprf_rpe"] = folder / family, folder / f"{family}-nprf_rpe"
    return paths


def load(paths: dict[str, Path], family: str, implementation: str) -> Any:
    """The saved model of ``family`` loaded with ``implementation`` (eval mode)."""
    from transformers import AutoModelForCausalLM

    key = f"{family}-nprf_rpe" if implementation == "kattn:nprf_rpe" else family
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        str(paths[key]), attn_implementation=implementation
    )
    return model.eval()


def generate(model: Any, tokens: int) -> dict[str, Any]:
    """Greedy generation of ``tokens`` new tokens after an 8-token prompt."""
    prompt = torch.randint(0, SHAPE["vocab"], (1, 8), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return {"new_tokens": int(out.shape[1] - 8), "seconds": time.perf_counter() - start}


def prefill(model: Any, context: int) -> tuple[Any, torch.Tensor]:
    """The cache after ``context`` random tokens (the kind ``generate`` makes), and a token."""
    from transformers import DynamicCache

    ids = torch.randint(0, SHAPE["vocab"], (1, context), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache)
    return cache, ids[:, -1:]


def time_steps(model: Any, cache: Any, token: torch.Tensor, steps: int) -> float:
    """Seconds per token of ``steps`` single-token forwards through ``cache``."""
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            model(token, cache=cache)
    return (time.perf_counter() - start) / steps


def state_kind(cache: Any) -> str:
    return type(cache.layers[0]).__name__


def measure(paths: dict[str, Path], args: argparse.Namespace) -> tuple[list, list]:
    """Generation of each model, then the interleaved decode timings at each context."""
    models = {(f, i): load(paths, f, i) for f in FAMILIES for i in IMPLEMENTATIONS}
    generation = [
        {"family": f, "implementation": i, **generate(m, args.generate)}
        for (f, i), m in models.items()
    ]
    rows = []
    for context in args.contexts:
        times: dict[tuple[str, str], list[float]] = {key: [] for key in models}
        starts: dict[tuple[str, str], list[int]] = {key: [] for key in models}
        layers: dict[tuple[str, str], str] = {}
        for _ in range(args.rounds):
            for key, model in models.items():
                # a fresh prefill each round (not timed), so that every round's steps follow
                # `context` tokens rather than those of the rounds before
                cache, token = prefill(model, context)
                starts[key].append(cache.get_seq_length())
                layers[key] = state_kind(cache)
                times[key].append(time_steps(model, cache, token, args.steps))
        for (family, implementation), values in times.items():
            rows.append(
                {
                    "family": family,
                    "implementation": implementation,
                    "context": context,
                    "cache_layer": layers[(family, implementation)],
                    "context_per_round": starts[(family, implementation)],
                    "ms_per_token": 1e3 * statistics.median(values),
                    "ms_per_token_rounds": [1e3 * v for v in values],
                }
            )
    return generation, rows


def growth(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per model, time per token at the longest context over that at the shortest."""
    out = {}
    for family in FAMILIES:
        for implementation in IMPLEMENTATIONS:
            mine = sorted(
                (r for r in rows if (r["family"], r["implementation"]) == (family, implementation)),
                key=lambda r: r["context"],
            )
            out[f"{family} {implementation}"] = mine[-1]["ms_per_token"] / mine[0]["ms_per_token"]
    return out


def render(report: dict[str, Any]) -> str:
    """The markdown table: ms per token by context, and the growth over the contexts."""
    contexts = report["config"]["contexts"]
    head = "| model | attention | " + " | ".join(f"{c} ctx (ms/token)" for c in contexts)
    lines = [
        "# Decode time per token, Hugging Face models with kattn mechanisms",
        "",
        f"Machine: {report['machine']['processor']}, {report['config']['threads']} thread(s); "
        f"median of {report['config']['rounds']} rounds of {report['config']['steps']} steps.",
        "",
        head + f" | {contexts[-1]} / {contexts[0]} |",
        "|---|---|" + "---|" * (len(contexts) + 1),
    ]
    for family in FAMILIES:
        for implementation in IMPLEMENTATIONS:
            cells = [
                f"{r['ms_per_token']:.2f}"
                for c in contexts
                for r in report["rows"]
                if (r["family"], r["implementation"], r["context"]) == (family, implementation, c)
            ]
            ratio = report["growth"][f"{family} {implementation}"]
            lines.append(
                f"| {family} | `{implementation}` | " + " | ".join(cells) + f" | {ratio:.2f}× |"
            )
    lines += ["", "Generation (greedy, after an 8-token prompt):", ""]
    lines += [
        f"- {g['family']} `{g['implementation']}`: {g['new_tokens']} new tokens in "
        f"{g['seconds']:.2f} s"
        for g in report["generation"]
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="128,512,2048", help="comma-separated lengths")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=32, help="single-token steps per round")
    parser.add_argument("--generate", type=int, default=100, help="tokens each model generates")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="contexts 16,32; 2 rounds; 10 tokens")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.contexts, args.rounds, args.steps, args.generate = "16,32", 2, 2, 10
    args.contexts = [int(c) for c in str(args.contexts).split(",")]
    if min(args.contexts) < 1 or max(args.contexts) + args.steps > 8000:
        parser.error("--contexts must be positive and leave room below 8,000 positions")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_start, start = os.getloadavg(), time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        generation, rows = measure(save_checkpoints(Path(folder)), args)
    info = machine_info()
    report: dict[str, Any] = {
        "machine": info,
        "command": " ".join(["python", "benchmarks/hf_decode.py", *sys.argv[1:]]),
        "environment": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "config": {
            "models": {"shape": SHAPE, "families": FAMILIES, "llama_kv_heads": 2},
            "implementations": IMPLEMENTATIONS,
            "options": {"kattn:performer": "defaults", "kattn:nprf_rpe": "rpe=decay, M=64"},
            "contexts": args.contexts,
            "rounds": args.rounds,
            "steps": args.steps,
            "batch": 1,
            "dtype": "float32",
            "threads": torch.get_num_threads(),
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_seconds": time.perf_counter() - start,
        "generation": generation,
        "rows": rows,
        "growth": growth(rows),
    }
    write_run(args.out, "hf-decode", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
