"""``kattn translate``: translate lines with a trained translation run (``kattn train --task
translation``), by beam search with the run's decoding settings unless flags change them."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from ..train.bleu import corpus_bleu, translate_texts
from ..train.distributed import check_device
from ..train.trained import load_trained_model
from ..train.translation import decoding_of
from ..train.translation_data import max_len


def add_translate_parser(sub: Any) -> None:
    """Add ``translate`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "translate",
        help="translate text with a trained translation run (kattn train --task translation)",
        description="Translate each line of --input (a file, or - for standard input) with a "
        "translation run, one output line per input line. Decoder self-attention with a "
        "recurrent form decodes with a constant-size state per token; the cross-attention "
        "keys and values are computed once per sentence.",
    )
    p.add_argument("--run", required=True, help="the run folder of kattn train --task translation")
    p.add_argument("--input", required=True, help="a UTF-8 file of sentences, or - (stdin)")
    p.add_argument("--output", help="write the translations here (default: standard output)")
    p.add_argument("--reference", help="a file of reference lines: print BLEU to stderr")
    p.add_argument("--beam", type=int, help="beam size (1: greedy; default: the run's)")
    p.add_argument("--length-penalty", type=float, help="fairseq's α (default: the run's)")
    p.add_argument("--checkpoint", default="best", choices=("best", "last"))
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.set_defaults(func=cmd_translate)


def _lines(source: str) -> list[str]:
    if source == "-":
        return [line.rstrip("\n") for line in sys.stdin]
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"--input {path}: no such file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"--input {path} is not UTF-8 text: {err}") from None


def cmd_translate(args: argparse.Namespace) -> int:
    check_device(args.device, "--device")
    model, config, bpe = load_trained_model(args.run, args.checkpoint, args.device)
    if config.data.task != "translation":
        raise ValueError(f"{args.run} is a {config.data.task} run, not a translation run")
    decoding = decoding_of(config)
    if args.beam is not None:
        if args.beam < 1:
            raise ValueError(f"--beam must be positive, got {args.beam}")
        decoding = dataclasses.replace(decoding, beam_size=args.beam)
    if args.length_penalty is not None:
        decoding = dataclasses.replace(decoding, length_penalty=args.length_penalty)
    lines = _lines(args.input)
    device = next(model.parameters()).device
    started = time.perf_counter()
    outputs = translate_texts(model, bpe, lines, decoding, device, max_len(config))  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    text = "".join(f"{line}\n" for line in outputs)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    note = f"[{len(lines)} lines in {seconds:.2f} s, beam {decoding.beam_size}"
    if args.reference:
        refs = _lines(args.reference)
        note += f", BLEU {corpus_bleu(outputs, refs)['bleu']:.2f}"
    print(note + "]", file=sys.stderr)
    return 0
