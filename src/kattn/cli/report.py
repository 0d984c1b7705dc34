"""``kattn report``: training runs and benchmark outputs gathered into one markdown report."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bench.report import write_report


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``report`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "report",
        help="gather training runs and benchmark outputs into one markdown report",
        description="Finds results.json of training runs and the JSON outputs of "
        "`kattn bench` below the given folders and writes one markdown report with their "
        "tables and plots (validation curves of the runs are plotted beside it).",
    )
    p.add_argument("paths", nargs="+", type=Path, help="run folders, benchmark folders or files")
    p.add_argument("--out", type=Path, default=Path("runs/report.md"), help="the report file")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    text = write_report(args.paths, args.out)
    print(text)
    print(f"written: {args.out}")
    return 0
