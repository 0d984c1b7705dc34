"""``kattn bench ...`` subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .approx import (
    NORM_SWEEP_VARIANTS,
    norm_sweep,
    plot_norm_sweep,
    rows_to_csv,
    rows_to_markdown,
)
from .timing import machine_info

EXPERIMENTS = ("norm-sweep",)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks and approximation studies")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    p = kinds.add_parser(
        "approx",
        help="approximation studies (norm-sweep: seed 000 Fig. 1b)",
        description="norm-sweep: ‖A − Â‖₁ of one softmax attention row against its "
        "random-feature estimate, for q and k on the unit sphere scaled by R, as the number "
        "of features M grows (PRF, TRF and normalised PRF). Writes CSV, markdown and PNG.",
    )
    p.add_argument("--experiment", choices=EXPERIMENTS, default="norm-sweep")
    p.add_argument("--out", type=Path, default=Path("runs/bench/approx"))
    p.add_argument("--radii", type=_floats, default=None, help="default 1,2,3,4,5")
    p.add_argument("--features", type=_ints, default=None, help="default 4,16,64,256,1024")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--keys", type=int, default=1024)
    p.add_argument("--seeds", type=int, default=None, help="default 10")
    p.add_argument(
        "--variants",
        default=",".join(v[0] for v in NORM_SWEEP_VARIANTS),
        help="comma-separated subset of " + ", ".join(v[0] for v in NORM_SWEEP_VARIANTS),
    )
    p.add_argument(
        "--quick", action="store_true", help="defaults of 2 seeds, M up to 256, R in 1,3,5"
    )
    p.set_defaults(func=cmd_bench_approx)


def cmd_bench_approx(args: argparse.Namespace) -> int:
    known = {v[0]: v for v in NORM_SWEEP_VARIANTS}
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {sorted(known)}")
    quick = args.quick
    args.seeds = args.seeds or (2 if quick else 10)
    args.features = args.features or ((4, 16, 64, 256) if quick else (4, 16, 64, 256, 1024))
    args.radii = args.radii or ((1, 3, 5) if quick else (1, 2, 3, 4, 5))
    rows = []
    for name in chosen:
        print(f"norm-sweep: {name} ...", file=sys.stderr, flush=True)
        rows += norm_sweep(
            radii=args.radii,
            features=args.features,
            dim=args.dim,
            keys=args.keys,
            seeds=args.seeds,
            variants=(known[name],),
        )
    info = machine_info()
    caption = (
        f"d={args.dim}, {args.keys} keys, one query, unit sphere × R; mean over {args.seeds} "
        f"seeds (bars: standard error of the mean). "
        f"kattn {info['kattn']}, torch {torch.__version__}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "norm-sweep.csv").write_text(rows_to_csv(rows))
    markdown = f"# Norm sweep (seed 000 §3.3, Fig. 1b)\n\n{caption}.\n\n{rows_to_markdown(rows)}"
    (args.out / "norm-sweep.md").write_text(markdown)
    plot = plot_norm_sweep(rows, args.out / "norm-sweep.png", caption)
    print(markdown)
    written = ["norm-sweep.csv", "norm-sweep.md"] + (["norm-sweep.png"] if plot else [])
    print(f"written to {args.out}: {', '.join(written)}")
    return 0
