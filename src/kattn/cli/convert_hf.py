"""``kattn convert --hf DIR --to MECHANISM [--out DIR2]``: a saved Hugging Face model's
attention converted to a kattn mechanism without fine-tuning (Luo et al. 2021, §4.5), scored
before and after, and saved so that ``kattn.hf.from_pretrained`` loads it back."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..train.distributed import check_device
from ..train.hf_conversion import RECORD_FILE, HFConversion, convert_hf_checkpoint
from .types import int_at_least

#: flags of ``kattn convert`` that only a translation run (--run) reads.
RUN_ONLY = {"only": "--only", "no_strict": "--no-strict"}


def add_hf_arguments(p: argparse.ArgumentParser) -> None:
    """The flags ``kattn convert --hf`` adds to ``kattn convert``."""
    p.add_argument(
        "--text",
        metavar="FILE",
        help="with --hf: the UTF-8 text to score the model on (default: an embedded text of "
        "a few paragraphs)",
    )
    p.add_argument(
        "--length",
        type=int_at_least(2),
        default=128,
        help="with --hf: tokens per scored window (default 128, at most the model's limit)",
    )
    p.add_argument(
        "--max-tokens",
        type=int_at_least(2),
        default=4096,
        help="with --hf: score at most this many tokens of the text (default 4096)",
    )


def cmd_convert_hf(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Convert ``args.hf`` to ``args.to`` with ``options``, print the scores before and
    after, save to ``args.out``."""
    check_device(args.device, "--device")
    for key, flag in RUN_ONLY.items():
        if getattr(args, key, None):
            raise ValueError(f"{flag} applies to --run (a translation run), not to --hf")
    result = convert_hf_checkpoint(
        args.hf, args.to, options, out=args.out, text=args.text, length=args.length,
        max_tokens=args.max_tokens, seed=args.seed, device=args.device,
    )  # fmt: skip
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        print(report(result))
    return 0


def report(result: HFConversion) -> str:
    """The conversion and its scores as a few lines of text."""
    options = ", ".join(f"{k}={v}" for k, v in sorted(result.options.items())) or "defaults"
    text = result.text
    lines = [
        f"{result.source} ({result.model_class}, {result.kind}) -> {result.mechanism} "
        f"({options}); random features seeded {result.seed}",
        f"text: {text['source']} ({text['bytes']} bytes), {text['tokenizer']}; "
        f"{text['windows']} window(s) of {text['length']} tokens",
    ]
    if result.kind == "causal-lm":
        before, after = result.before["perplexity"], result.after["perplexity"]
        lines += [
            f"  {'':10}{'perplexity':>12}{'nll (nats)':>12}",
            f"  {'original':10}{before:>12.3f}{result.before['nll']:>12.4f}",
            f"  {'converted':10}{after:>12.3f}{result.after['nll']:>12.4f}",
            f"  next-token predictions agreeing: "
            f"{100 * result.agreement['next_token_agreement']:.1f}%",
        ]
    else:
        a = result.agreement
        lines.append(
            f"  last hidden states: mean cosine {a['mean_cosine']:.6f}, smallest "
            f"{a['min_cosine']:.6f}, relative error {a['relative_error']:.3g}"
        )
    if result.out is not None:
        lines.append(
            f"wrote {result.out} ({RECORD_FILE} holds these scores); loaded back with "
            f"kattn.hf.from_pretrained({result.model_class}, {result.out!r}): largest output "
            f"difference {result.reload_max_abs_diff:.3g}"
        )
    return "\n".join(lines)
