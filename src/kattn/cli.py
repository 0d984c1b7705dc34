"""The ``kattn`` command: ``list``, ``demo``, ``bench``, ``train``, ``eval``, ``data generate``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from . import __version__, features
from .bench.commands import add_bench_parser
from .bench.compare import compare_mechanisms, format_table
from .bench.timing import machine_info
from .data.commands import add_data_parser
from .registry import CAPABILITY_FLAGS, available, spec
from .train.commands import add_train_parsers

_FLAG_TITLES = {
    "supports_causal": "causal",
    "supports_padding_mask": "padding",
    "supports_cross": "cross",
    "supports_recurrent": "recurrent",
    "is_exact": "exact",
}


def _mechanism_table() -> str:
    titles = [_FLAG_TITLES[f] for f in CAPABILITY_FLAGS]
    lines = [
        "| mechanism | " + " | ".join(titles) + " | complexity | summary |",
        "|---|" + "---|" * len(titles) + "---|---|",
    ]
    for name in available():
        s = spec(name)
        marks = " | ".join("yes" if getattr(s, f) else "-" for f in CAPABILITY_FLAGS)
        lines.append(f"| {name} | {marks} | {s.complexity} | {s.summary} |")
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    if args.json:
        rows = []
        for name in available():
            s = spec(name)
            rows.append(
                {
                    "name": name,
                    "summary": s.summary,
                    "reference": s.reference,
                    "complexity": s.complexity,
                    "defaults": dict(s.defaults),
                    **{f: getattr(s, f) for f in CAPABILITY_FLAGS},
                }
            )
        print(json.dumps({"mechanisms": rows, "feature_maps": features.available()}, indent=2))
        return 0
    print("Mechanisms (kattn.build(name, ...)):\n")
    print(_mechanism_table())
    print(
        "\nFeature maps (kattn.build('kernelized', feature_map=...)): "
        + ", ".join(features.available())
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    cmd_list(argparse.Namespace(json=False))
    length = args.length or (256 if args.quick else 2048)
    repeats = args.repeats or (3 if args.quick else 7)
    names = args.mechanisms.split(",") if args.mechanisms else None
    info = machine_info()
    print(
        f"\nComparison with exact softmax attention: B=1, H={args.heads}, L={length}, "
        f"D=Dv={args.head_dim}, q and k ~ N(0, {args.input_std}²), fp32, forward, "
        f"median of {repeats} "
        f"(kattn {info['kattn']}, torch {info['torch']}, {info['processor']}, "
        f"{info['torch_threads']} threads)\n",
        flush=True,
    )

    def progress(name: str) -> None:
        print(f"  measuring {name} ...", file=sys.stderr, flush=True)

    rows = compare_mechanisms(
        names,
        heads=args.heads,
        length=length,
        head_dim=args.head_dim,
        repeats=repeats,
        input_std=args.input_std,
        progress=progress,
    )
    print(format_table(rows))
    print(
        "\nErrors are relative to softmax on the same inputs. Mechanisms that do not estimate "
        "softmax (linear: elu+1) differ by design; random-feature estimates degrade quickly as "
        "‖q‖, ‖k‖ grow (try --input-std 0.5)."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kattn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the registered mechanisms and feature maps")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("demo", help="list, then compare every mechanism with exact softmax")
    p.add_argument("--quick", action="store_true", help="a few seconds: L=256, 3 repeats")
    p.add_argument("--length", type=int, default=0, help="sequence length (default 2048)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=0, help="timed repeats (default 7)")
    p.add_argument("--input-std", type=float, default=1.0, help="std of q and k entries")
    p.add_argument("--mechanisms", default="", help="comma-separated names (default: all)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.set_defaults(func=cmd_demo)
    add_bench_parser(sub)
    add_train_parsers(sub)
    add_data_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError) as err:
        print(f"kattn: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
