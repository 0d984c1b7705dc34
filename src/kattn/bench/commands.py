"""``kattn bench ...`` subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..registry import available
from .approx import (
    NORM_SWEEP_VARIANTS,
    norm_sweep,
    plot_norm_sweep,
    rows_to_csv,
    rows_to_markdown,
)
from .spectral import (
    BERT_INIT_STD,
    SPECTRAL_PAIRS,
    plot_spectral,
    spectral_markdown,
    spectral_study,
)
from .stability import (
    LEARNING_RATE,
    TABLE3_MECHANISMS,
    plot_stability,
    stability_markdown,
    stability_study,
)
from .timing import machine_info

EXPERIMENTS = ("norm-sweep", "spectral")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks and approximation studies")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    p = kinds.add_parser(
        "approx",
        help="approximation studies (norm-sweep: seed 000 Fig. 1b; spectral: seed 003 Fig. 1)",
        description="norm-sweep: ‖A − Â‖₁ of one softmax attention row against its "
        "random-feature estimate, for q and k on the unit sphere scaled by R, as the number "
        "of features M grows (PRF, TRF and normalised PRF). spectral: relative spectral-norm "
        "error of the outputs of Skyformer (vs exact Gaussian-kernel attention), "
        "Nyströmformer, Performer and Linformer (vs softmax) as the number of landmarks / "
        "features / projected length grows. Each writes CSV, markdown and PNG.",
    )
    p.add_argument("--experiment", choices=EXPERIMENTS, default="norm-sweep")
    p.add_argument("--out", type=Path, default=Path("runs/bench/approx"))
    p.add_argument(
        "--features",
        type=_ints,
        default=None,
        help="norm-sweep default 4,16,64,256,1024; spectral 16,32,64,128,256",
    )
    p.add_argument("--dim", type=int, default=64, help="head dimension")
    p.add_argument("--seeds", type=int, default=None, help="default 10 (norm-sweep), 5 (spectral)")
    p.add_argument("--radii", type=_floats, default=None, help="norm-sweep: default 1,2,3,4,5")
    p.add_argument("--keys", type=int, default=1024, help="norm-sweep: number of keys")
    p.add_argument(
        "--variants",
        default=",".join(v[0] for v in NORM_SWEEP_VARIANTS),
        help="norm-sweep: comma-separated subset of "
        + ", ".join(v[0] for v in NORM_SWEEP_VARIANTS),
    )
    p.add_argument("--lengths", type=_ints, default=None, help="spectral: default 256,512,1024")
    p.add_argument("--heads", type=int, default=4, help="spectral: heads (independent samples)")
    p.add_argument("--input-std", type=float, default=BERT_INIT_STD,
                   help="spectral: std of the q, k, v entries (default: BERT-base at "
                   "initialisation, 0.02·√768)")  # fmt: skip
    p.add_argument(
        "--mechanisms",
        default=",".join(pair[0] for pair in SPECTRAL_PAIRS),
        help="spectral: comma-separated subset of " + ", ".join(x[0] for x in SPECTRAL_PAIRS),
    )
    p.add_argument("--quick", action="store_true", help="a small version of the experiment")
    p.set_defaults(func=cmd_bench_approx)
    st = kinds.add_parser(
        "stability",
        help="instability score of the first training steps (seed 003 Appendix F)",
        description="τ_i = ‖f(x_i, W_i) − f(x_i, W_{i−1})‖² / ‖W_i − W_{i−1}‖² over the first "
        "optimiser steps of a 2-layer encoder (Skyformer's LRA model), as a ratio to softmax "
        "attention from the same start on the same batches. Writes CSV, markdown and PNG.",
    )
    st.add_argument(
        "--mechanisms",
        default=",".join(TABLE3_MECHANISMS),
        help="comma-separated registered mechanisms (softmax is the baseline)",
    )
    st.add_argument("--steps", type=int, default=None, help="default 20")
    st.add_argument("--seeds", type=int, default=None, help="default 5")
    st.add_argument("--batch", type=int, default=8)
    st.add_argument("--length", type=int, default=None, help="default 512")
    st.add_argument(
        "--lr",
        type=float,
        default=LEARNING_RATE,
        help="default 4e-6: the first steps of the paper's one-cycle schedule",
    )
    st.add_argument("--out", type=Path, default=Path("runs/bench/stability"))
    st.add_argument("--quick", action="store_true", help="defaults of 5 steps, 1 seed, length 160")
    st.set_defaults(func=cmd_bench_stability)


def cmd_bench_approx(args: argparse.Namespace) -> int:
    if args.experiment == "spectral":
        return _spectral(args)
    return _norm_sweep(args)


def cmd_bench_stability(args: argparse.Namespace) -> int:
    names = _subset(args.mechanisms, [n for n in available() if n != "softmax"], "mechanism(s)")
    _resolve(args, {"steps": (5, 20), "seeds": (1, 5), "length": (160, 512)})
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if args.length <= 128:
        print(
            f"stability: note: at length {args.length} <= 128 landmarks, skyformer and "
            "nystromformer take every token as a landmark (Nyströmformer is exact there)",
            file=sys.stderr,
        )
    rows = stability_study(
        names,
        steps=args.steps,
        seeds=args.seeds,
        batch=args.batch,
        length=args.length,
        lr=args.lr,
        progress=lambda text: print(f"stability: {text}", file=sys.stderr, flush=True),
    )
    info = machine_info()
    caption = (
        f"2 pre-LN layers, width 64, 2 heads, MLP 128; batch {args.batch} × {args.length} "
        f"synthetic tokens; AdamW lr {args.lr:g}; {args.steps} steps, {args.seeds} seed(s). "
        f"kattn {info['kattn']}, torch {torch.__version__}"
    )
    title = "# Instability score (seed 003 Appendix F, Table 3)"
    markdown = f"{title}\n\n{caption}.\n\n{stability_markdown(rows)}"
    return _write(args.out, "stability", rows, markdown, plot_stability, caption)


def _resolve(args: argparse.Namespace, defaults: dict[str, tuple]) -> None:
    """Fill the options left unset (None) with their ``(quick, full)`` default and check that
    every number given is >= 1."""
    for key, (small, full) in defaults.items():
        value = getattr(args, key)
        if value is None:
            setattr(args, key, small if args.quick else full)
        elif any(x < 1 for x in (value if isinstance(value, tuple) else (value,))):
            raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {value}")


def _subset(text: str, known: list[str], what: str) -> list[str]:
    chosen = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in chosen if x not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown or no {what} {unknown}; choose from {known}")
    return chosen


def _spectral(args: argparse.Namespace) -> int:
    names = _subset(args.mechanisms, [p[0] for p in SPECTRAL_PAIRS], "mechanism(s)")
    _resolve(args, {"seeds": (2, 5), "features": ((16, 64), (16, 32, 64, 128, 256)),
                    "lengths": ((128, 256), (256, 512, 1024))})  # fmt: skip
    rows = spectral_study(
        lengths=args.lengths,
        features=args.features,
        head_dim=args.dim,
        heads=args.heads,
        seeds=args.seeds,
        input_std=args.input_std,
        pairs=tuple(pair for pair in SPECTRAL_PAIRS if pair[0] in names),
        progress=lambda text: print(f"spectral: {text}", file=sys.stderr, flush=True),
    )
    info = machine_info()
    caption = (
        f"D=Dv={args.dim}, q, k, v entries N(0, {args.input_std:.3g}²); mean over {args.heads} "
        f"heads × {args.seeds} seeds (bars: standard error). kattn {info['kattn']}, "
        f"torch {torch.__version__}"
    )
    title = "# Spectral-norm approximation error (seed 003 §4.5, Fig. 1)"
    return _write(args.out, "spectral", rows, f"{title}\n\n{caption}.\n\n"
                  + spectral_markdown(rows), plot_spectral, caption)  # fmt: skip


def _write(out: Path, stem: str, rows: list, markdown: str, plot, caption: str) -> int:  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.csv").write_text(rows_to_csv(rows))
    (out / f"{stem}.md").write_text(markdown)
    png = plot(rows, out / f"{stem}.png", caption)
    print(markdown)
    written = [f"{stem}.csv", f"{stem}.md"] + ([f"{stem}.png"] if png else [])
    print(f"written to {out}: {', '.join(written)}")
    return 0


def _norm_sweep(args: argparse.Namespace) -> int:
    known = {v[0]: v for v in NORM_SWEEP_VARIANTS}
    chosen = _subset(args.variants, list(known), "variant(s)")
    _resolve(args, {"seeds": (2, 10), "features": ((4, 16, 64, 256), (4, 16, 64, 256, 1024)),
                    "radii": ((1, 3, 5), (1, 2, 3, 4, 5))})  # fmt: skip
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
    markdown = f"# Norm sweep (seed 000 §3.3, Fig. 1b)\n\n{caption}.\n\n{rows_to_markdown(rows)}"
    return _write(args.out, "norm-sweep", rows, markdown, plot_norm_sweep, caption)
