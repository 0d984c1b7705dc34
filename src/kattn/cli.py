"""The ``kattn`` command: list, demo, bench, report, train, eval, generate, data generate."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import __version__, features
from .bench.commands import add_bench_parser
from .bench.demo import add_demo_parser
from .bench.report import add_report_parser
from .data.commands import add_data_parser
from .registry import CAPABILITY_FLAGS, available, spec
from .train.commands import add_train_parsers
from .train.generate_command import add_generate_parser

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kattn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the registered mechanisms and feature maps")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_report_parser(sub)
    add_train_parsers(sub)
    add_generate_parser(sub)
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
