"""``kattn generate``: continue a prompt with a trained language model run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from ..nn import CausalLM
from ..nn.generation import STRATEGIES
from .distributed import check_device


def add_generate_parser(sub: Any) -> None:
    """Add ``generate`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained language model (kattn train --task lm)",
        description="Sample a continuation of --prompt from a language-model run. Mechanisms "
        "with a recurrent form decode in constant time and memory per token (softmax with a "
        "key/value cache); others re-encode the sequence for every token, with a warning.",
    )
    p.add_argument("--run", required=True, help="the run folder of `kattn train --task lm`")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to add (default 200)")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="softmax temperature; 0 is greedy"
    )
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens only")
    p.add_argument("--top-p", type=float, help="sample within the nucleus of this probability")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations to draw")
    p.add_argument("--checkpoint", default="best", choices=("best", "last"))
    p.add_argument("--strategy", default="auto", choices=STRATEGIES)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--json", action="store_true", help="print the samples and timings as JSON")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from . import load_trained_model

    check_device(args.device, "--device")
    model, _, tokenizer = load_trained_model(
        args.run, checkpoint=args.checkpoint, device=args.device
    )
    if not isinstance(model, CausalLM) or tokenizer is None:
        raise ValueError(f"{args.run} is not a language-model run (train it with --task lm)")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be positive, got {args.num_samples}")
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise ValueError("--prompt is empty once tokenised: give at least one token of text")
    device = model.head.weight.device
    prompt = torch.tensor([list(ids)] * args.num_samples, dtype=torch.int64, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    started = time.perf_counter()
    out = model.generate(
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
        strategy=args.strategy,
    )
    seconds = time.perf_counter() - started
    texts = [tokenizer.decode(row.tolist()) for row in out]
    new = out.shape[1] - prompt.shape[1]
    strategy = args.strategy
    if strategy == "auto":
        strategy = "recurrent" if model.supports_recurrent else "reencode"
    timing = {
        "mechanism": model.mechanism,
        "strategy": strategy,
        "prompt_tokens": prompt.shape[1],
        "new_tokens": new,
        "seconds": seconds,
        "tokens_per_s": new * len(texts) / max(seconds, 1e-9),
    }
    if args.json:
        print(json.dumps({"samples": texts, **timing}, indent=2))
        return 0
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(text)
    print(
        f"[{timing['mechanism']}, {strategy}: {new} new tokens x {len(texts)} in "
        f"{seconds:.2f} s, {timing['tokens_per_s']:.1f} tokens/s]",
        file=sys.stderr,
    )
    return 0
