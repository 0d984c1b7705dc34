"""``kattn pattern``: draw the attention patterns of the sparse mechanisms."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..bench.patterns import pattern_mechanisms, write_patterns
from ..registry import MECHANISMS
from .types import int_at_least


def add_pattern_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``pattern`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "pattern",
        help="draw which keys each query reads (local, longformer, bigbird, sparse_transformer)",
        description="Summarise and draw the (L, L) attention pattern of mechanisms with a fixed "
        "sparse pattern: one PNG per mechanism (needs matplotlib: pip install 'kattn[plot]').",
    )
    p.add_argument(
        "mechanisms",
        nargs="*",
        help="mechanisms to draw (default: every mechanism with a pattern)",
    )
    p.add_argument("--length", type=int_at_least(1), default=256, help="sequence length L")
    p.add_argument("--causal", action="store_true", help="the causal form of each pattern")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="[NAME:]KEY=VALUE",
        help="a mechanism option (JSON value), for every listed mechanism that has it or only "
        "for NAME, e.g. block_size=16 or bigbird:num_random_blocks=2 (repeatable)",
    )
    p.add_argument("--out", type=Path, help="folder for the PNGs (default: summary only)")
    p.add_argument(
        "--tag",
        default="",
        help="appended to each PNG's name, to keep several option sets apart: "
        "<mechanism>[-causal][-TAG].png",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_pattern)


def cmd_pattern(args: argparse.Namespace) -> int:
    names = args.mechanisms or pattern_mechanisms()
    options = _options(names, args.option)
    summaries = write_patterns(
        names, args.out, length=args.length, causal=args.causal, options=options, tag=args.tag
    )
    if args.json:
        print(json.dumps([s.__dict__ for s in summaries], indent=2))
        return 0
    for s in summaries:
        shown = " ".join(f"{k}={v}" for k, v in s.options.items())
        print(
            f"{s.mechanism:<20} L={s.length}{' causal' if s.causal else ''}: keys per query "
            f"mean {s.mean_keys:.1f}, max {s.max_keys}, density {s.density:.3f}"
            + (f" [{shown}]" if shown else "")
            + (f" -> {s.image}" if s.image else "")
        )
    return 0


def _options(names: list[str], items: list[str]) -> dict[str, dict[str, Any]]:
    """``[NAME:]KEY=VALUE`` items as per-mechanism options (values parsed as JSON when they
    are JSON, else kept as strings); a KEY without NAME goes to each mechanism that has it."""
    options: dict[str, dict[str, Any]] = {name: {} for name in names}
    for item in items:
        target, _, assignment = item.rpartition(":")
        key, sep, raw = assignment.partition("=")
        if not sep or not key:
            raise ValueError(f"--option must be [NAME:]KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        chosen = [target] if target else names
        taken = False
        for name in chosen:
            if name not in options:
                raise ValueError(f"--option {item!r} names {name!r}, which is not being drawn")
            if key in (MECHANISMS.option_names(name) or ()):
                options[name][key] = value
                taken = True
        if not taken:
            raise ValueError(f"--option {item!r}: no mechanism drawn has an option {key!r}")
    return options
