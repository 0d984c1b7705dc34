"""``kattn demo``: the embedded default main job (:mod:`kattn.bench.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..bench.demo import FULL, QUICK, TRAINED, run_demo
from ..registry import available
from .types import int_at_least, name_list, output_folder


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "demo",
        help="the main job: speed, memory, error and ListOps accuracy of the mechanisms",
        description="Measures every registered mechanism on this machine with nothing to "
        "download (9 minutes on a 2-core CPU; --quick: about 20 seconds) and writes "
        "OUT/report.md with tables and plots.",
    )
    p.add_argument("--out", type=output_folder, default=Path("runs/demo"))
    p.add_argument(
        "--quick", action="store_true", help="a small version (about 20 seconds on a 2-core CPU)"
    )
    p.add_argument("--train", type=name_list, default=",".join(TRAINED),
                   help="comma-separated mechanisms trained on ListOps")  # fmt: skip
    p.add_argument("--threads", type=int_at_least(0), default=0,
                   help="torch threads (default 0: torch's)")  # fmt: skip
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    names = tuple(x.strip() for x in args.train.split(",") if x.strip())
    unknown = [n for n in names if n not in available()]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown} in --train; see `kattn list`")
    table = run_demo(args.out, QUICK if args.quick else FULL, trained=names)
    print(table)
    print(f"\nfull report: {args.out / 'report.md'}")
    return 0
