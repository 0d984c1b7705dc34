"""``kattn generate``: continue a prompt with a trained language model run
(:func:`kattn.train.generate.generate_text`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from ..nn.generation import STRATEGIES
from ..train.distributed import check_device
from ..train.generate import generate_text


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
    check_device(args.device, "--device")
    found = generate_text(
        args.run,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_samples=args.num_samples,
        checkpoint=args.checkpoint,
        strategy=args.strategy,
        device=args.device,
    )
    if args.json:
        print(json.dumps(asdict(found), indent=2))
        return 0
    texts = found.samples
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(text)
    print(
        f"[{found.mechanism}, {found.strategy}: {found.new_tokens} new tokens x {len(texts)} in "
        f"{found.seconds:.2f} s, {found.tokens_per_s:.1f} tokens/s]",
        file=sys.stderr,
    )
    return 0
