"""``kattn list``: the registered mechanisms and feature maps."""

from __future__ import annotations

import argparse
import json

from .. import features
from ..catalogue import mechanism_rows, mechanism_table_markdown


def add_list_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``list`` to the ``kattn`` subcommands."""
    p = sub.add_parser("list", help="list the registered mechanisms and feature maps")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output")
    form.add_argument(
        "--markdown", action="store_true", help="only the markdown table of the mechanisms"
    )
    p.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    if args.json:
        rows = mechanism_rows()
        print(json.dumps({"mechanisms": rows, "feature_maps": features.available()}, indent=2))
        return 0
    if args.markdown:
        print(mechanism_table_markdown())
        return 0
    print("Mechanisms (kattn.build(name, ...)):\n")
    print(mechanism_table_markdown())
    print(
        "\nFeature maps (kattn.build('kernelized', feature_map=...)): "
        + ", ".join(features.available())
    )
    return 0
