"""``kattn convert``: replace the attentions of a trained translation run by kernelized
attention without fine-tuning (Luo et al. 2021, §4.5) and show the loss and BLEU before and
after; ``--out`` writes the converted model as a run folder."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..train.checkpoint import json_text
from ..train.conversion import (
    convert_run,
    evaluate_translation,
    load_run_data,
    write_converted_run,
)
from ..train.distributed import check_device
from ..train.overrides import parse_value
from ..train.trained import load_trained_model
from ..train.translation import decoding_of
from .convert_hf import add_hf_arguments, cmd_convert_hf
from .types import int_at_least


def add_convert_parser(sub: Any) -> None:
    """Add ``convert`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "convert",
        help="convert a trained translation run's (or a saved Hugging Face model's) attentions "
        "to kernelized attention without fine-tuning, and score it before and after",
        description="Replace the attentions of a translation run (kattn train --task "
        "translation) by another mechanism, keeping the projections and every learnt entry "
        "the two share (relative encoding, temperature), without fine-tuning (Luo et al. "
        "2021, §4.5), and print the conversion and the validation loss and BLEU before and "
        "after. --to auto converts each attention to its kernelized counterpart: softmax -> "
        "performer, softmax_rpe -> prf_rpe, normalized_softmax -> kernelized PRF over "
        "normalised q/k with the learnt temperature, with rpe -> nprf_rpe. Conversions that "
        "plainly change the function are refused (exit code 2) unless --no-strict. With --hf "
        "DIR instead of --run, a Hugging Face model saved with save_pretrained runs the "
        "mechanism in every attention layer (auto: performer), is scored before and after "
        "(a causal LM by perplexity on --text, any other model by the cosine of its last "
        "hidden states) and, with --out, saved for kattn.hf.from_pretrained.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="the run folder of kattn train --task translation")
    source.add_argument(
        "--hf", metavar="DIR", help="a Hugging Face model folder written by save_pretrained"
    )
    p.add_argument(
        "--to",
        required=True,
        metavar="MECHANISM",
        help="auto, or the mechanism of every converted attention (kattn list); each keeps "
        "its relative encoding options",
    )
    p.add_argument(
        "--attention-option",
        action="append",
        metavar="KEY=VALUE",
        help="an option of the new mechanism, e.g. num_features=64 (repeatable)",
    )
    p.add_argument(
        "--only",
        metavar="PATTERN",
        help="convert only the attention modules whose name matches this fnmatch pattern: "
        "encoder.* (encoder self-attention), layers.*.self_attn (decoder), "
        "layers.*.cross_attn (cross-attention)",
    )
    p.add_argument("--split", default="valid", choices=("valid", "test"))
    p.add_argument(
        "--bleu-examples",
        type=int_at_least(0),
        default=400,
        help="BLEU on the first N pairs of the split (default 400; 0: no BLEU)",
    )
    p.add_argument(
        "--beam",
        type=int_at_least(1),
        default=1,
        help="beam size of the BLEU decoding (default 1: greedy, fast on a CPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random features (default 0)")
    p.add_argument("--checkpoint", default="best", choices=("best", "last"))
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--no-strict", action="store_true", help="convert what strict would refuse")
    p.add_argument(
        "--out",
        help="write the converted model here: a run folder (--run) or a save_pretrained "
        "folder (--hf)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_hf_arguments(p)
    p.set_defaults(func=cmd_convert)


def _options(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` items as options; values read as JSON when they parse (``64``, ``true``,
    ``null``), else kept as text."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--attention-option is KEY=VALUE, got {item!r}")
        options[key] = parse_value(value)
    return options


def cmd_convert(args: argparse.Namespace) -> int:
    if args.hf is not None:
        return cmd_convert_hf(args, _options(args.attention_option))
    check_device(args.device, "--device")
    config, data = load_run_data(args.run)
    try:
        converted, conversion = convert_run(
            args.run, None if args.to == "auto" else args.to, _options(args.attention_option),
            only=args.only, checkpoint=args.checkpoint, device=args.device, seed=args.seed,
            strict=not args.no_strict,
        )  # fmt: skip
    except ValueError as err:  # the library's advice, in the command's words
        raise ValueError(str(err).replace("pass strict=False", "pass --no-strict")) from None
    # the run's decoding (length penalty, length limits) with the command's beam
    decoding = dataclasses.replace(decoding_of(config), beam_size=args.beam)

    def score(model: Any) -> dict[str, Any]:
        return evaluate_translation(
            model, config, data, args.split, bleu_examples=args.bleu_examples, decoding=decoding
        )

    trained, _, _ = load_trained_model(args.run, args.checkpoint, args.device)
    before = score(trained)
    del trained
    after = score(converted)
    metrics = {"split": args.split, "before": before, "after": after}
    if args.out:
        write_converted_run(converted, conversion, args.out, metrics)
    if args.json:
        result = {"conversion": conversion.as_dict(), **metrics, "out": args.out}
        print(json_text(result, indent=2))
        return 0
    step = "" if conversion.step is None else f", step {conversion.step}"
    print(f"{args.run} ({args.checkpoint}{step}); random features seeded {conversion.seed}:")
    for line in conversion.kind_lines():
        print(f"  {line}")
    print(_table(before, after, args.split))
    if args.out:
        print(f"wrote {args.out} (kattn translate --run {args.out} --input FILE)")
    return 0


def _table(before: dict[str, Any], after: dict[str, Any], split: str) -> str:
    keys = [("loss", "loss", 4), ("bleu", "BLEU", 2), ("accuracy", "accuracy", 4)]
    shown = [(k, name, d) for k, name, d in keys if k in before]
    note = ""
    if "bleu" in before:
        decoding = before["decoding"]
        how = "greedy" if decoding["beam_size"] == 1 else f"beam {decoding['beam_size']}"
        note = f" (BLEU of the first {before['bleu_sentences']} pairs, {how})"
    lines = [f"{split}{note}:", f"  {'':10}" + "".join(f"{name:>12}" for _, name, _ in shown)]
    for label, values in (("trained", before), ("converted", after)):
        lines.append(f"  {label:10}" + "".join(f"{values[k]:>12.{d}f}" for k, _, d in shown))
    change = "".join(f"{after[k] - before[k]:>+12.{d}f}" for k, _, d in shown)
    lines.append(f"  {'change':10}" + change)
    return "\n".join(lines)
