"""``kattn bench ...`` subcommands."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..registry import available
from .approx import (
    NORM_SWEEP_VARIANTS,
    SAMPLINGS,
    norm_sweep,
    plot_norm_sweep,
    rows_to_csv,
    rows_to_markdown,
)
from .cli_types import (
    int_at_least,
    int_list,
    name_list,
    output_folder,
    positive_float,
    positive_float_list,
)
from .kernel_error import KERNEL_VARIANTS, kernel_markdown, kernel_study, plot_kernel
from .mechanism_error import (
    approximate_mechanisms,
    mechanism_markdown,
    mechanism_study,
    plot_mechanisms,
)
from .spectral import (
    BERT_INIT_STD,
    SPECTRAL_PAIRS,
    plot_spectral,
    spectral_markdown,
    spectral_study,
)
from .speed_command import add_speed_parser
from .stability import (
    LEARNING_RATE,
    TABLE3_MECHANISMS,
    plot_stability,
    stability_markdown,
    stability_study,
)
from .timing import machine_info

EXPERIMENTS = ("norm-sweep", "spectral", "kernel", "mechanisms")
#: the experiments each option of ``kattn bench approx`` applies to (given elsewhere: an error)
_APPLIES = {
    "features": ("norm-sweep", "spectral", "kernel"),
    "radii": ("norm-sweep",),
    "keys": ("norm-sweep", "kernel"),
    "variants": ("norm-sweep", "kernel"),
    "lengths": ("spectral", "mechanisms"),
    "heads": ("spectral", "mechanisms"),
    "input_std": ("spectral", "kernel", "mechanisms"),
    "mechanisms": ("spectral", "mechanisms"),
    "sampling": ("norm-sweep",),
}


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks and approximation studies")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    add_speed_parser(kinds)
    p = kinds.add_parser(
        "approx",
        help="approximation studies (norm-sweep: Luo et al. 2021, Fig. 1b; spectral: "
        "Chen et al. 2021, Fig. 1; "
        "kernel: feature maps vs exact kernels; mechanisms: vs exact counterparts)",
        description="norm-sweep: ‖A − Â‖₁ of one softmax attention row against its "
        "random-feature estimate, for q and k on the unit sphere scaled by R, as the number "
        "of features M grows (PRF, TRF and normalised PRF). spectral: relative spectral-norm "
        "error of the outputs of Skyformer (vs exact Gaussian-kernel attention), "
        "Nyströmformer, Performer and Linformer (vs softmax) as the number of landmarks / "
        "features / projected length grows. kernel: MSE of φ(Q)φ(K)ᵀ against the exact "
        "kernel of each random-feature map as M grows. mechanisms: relative Frobenius error of "
        "every approximate mechanism against its exact counterpart (skyformer: gaussian; most "
        "others: softmax) as L grows. Each writes CSV, JSON, markdown and PNG.",
    )
    p.add_argument("--experiment", choices=EXPERIMENTS, default="norm-sweep")
    p.add_argument("--out", type=output_folder, default=Path("runs/bench/approx"))
    p.add_argument(
        "--features",
        type=int_list(1),
        default=None,
        help="norm-sweep default 4,16,64,256,1024; spectral 16,32,64,128,256; "
        "kernel 16,32,64,128,256,512",
    )
    p.add_argument("--dim", type=int_at_least(1), default=64, help="head dimension")
    p.add_argument(
        "--seeds",
        type=int_at_least(1),
        default=None,
        help="default 10 (norm-sweep, kernel), 5 (spectral), 2 (mechanisms)",
    )
    p.add_argument("--radii", type=positive_float_list, default=None,
                   help="norm-sweep: default 1,2,3,4,5")  # fmt: skip
    p.add_argument(
        "--keys",
        type=int_at_least(1),
        default=None,
        help="norm-sweep: number of keys (1024); kernel: queries and keys (256)",
    )
    p.add_argument(
        "--sampling",
        choices=tuple(SAMPLINGS),
        default=None,
        help="norm-sweep: how the rows of the projection W are drawn: iid, w ~ N(0, I_D) "
        "(default, as in Luo et al. 2021, Fig. 1b); orthogonal, orthogonal in blocks of D with "
        "Gaussian norms (Choromanski et al. 2021 §2.4); sphere, uniform on the sphere of "
        "radius √D",
    )
    p.add_argument(
        "--variants",
        type=name_list,
        default=None,
        help="comma-separated subset (default: all) of, norm-sweep: "
        + ", ".join(v[0] for v in NORM_SWEEP_VARIANTS)
        + "; kernel: "
        + ", ".join(v.label for v in KERNEL_VARIANTS),
    )
    p.add_argument("--lengths", type=int_list(2), default=None,
                   help="spectral: default 256,512,1024; mechanisms: 256,1024")  # fmt: skip
    p.add_argument("--heads", type=int_at_least(1), default=None,
                   help="spectral, mechanisms: heads, independent samples (default 4)")  # fmt: skip
    p.add_argument("--input-std", type=positive_float, default=None,
                   help="spectral, kernel, mechanisms: std of the q, k (spectral: and v) entries "
                   "(default: BERT-base at initialisation, 0.02·√768 ≈ 0.55)")  # fmt: skip
    p.add_argument(
        "--mechanisms",
        type=name_list,
        default=None,
        help="comma-separated subset (default: all) of, spectral: "
        + ", ".join(x[0] for x in SPECTRAL_PAIRS)
        + "; mechanisms: the approximate registered mechanisms",
    )
    p.add_argument("--quick", action="store_true", help="a small version of the experiment")
    p.set_defaults(func=cmd_bench_approx)
    st = kinds.add_parser(
        "stability",
        help="instability score of the first training steps (Chen et al. 2021, Appendix F)",
        description="τ_i = ‖f(x_i, W_i) − f(x_i, W_{i−1})‖² / ‖W_i − W_{i−1}‖² over the first "
        "optimiser steps of a 2-layer encoder (Skyformer's LRA model), as a ratio to softmax "
        "attention from the same start on the same batches. Writes CSV, JSON, markdown and PNG.",
    )
    st.add_argument(
        "--mechanisms",
        type=name_list,
        default=",".join(TABLE3_MECHANISMS),
        help="comma-separated registered mechanisms (softmax is the baseline)",
    )
    st.add_argument("--steps", type=int_at_least(1), default=None, help="default 20")
    st.add_argument("--seeds", type=int_at_least(1), default=None, help="default 5")
    st.add_argument("--batch", type=int_at_least(1), default=8)
    st.add_argument("--length", type=int_at_least(1), default=None, help="default 512")
    st.add_argument(
        "--lr",
        type=positive_float,
        default=LEARNING_RATE,
        help="default 4e-6: the first steps of the paper's one-cycle schedule",
    )
    st.add_argument("--out", type=output_folder, default=Path("runs/bench/stability"))
    st.add_argument("--quick", action="store_true", help="defaults of 5 steps, 1 seed, length 160")
    st.set_defaults(func=cmd_bench_stability)


def cmd_bench_approx(args: argparse.Namespace) -> int:
    for option, experiments in _APPLIES.items():
        if getattr(args, option) is not None and args.experiment not in experiments:
            raise ValueError(
                f"--{option.replace('_', '-')} applies to --experiment "
                f"{' or '.join(experiments)}, not {args.experiment}"
            )
    if args.input_std is None:
        args.input_std = BERT_INIT_STD
    run = {"spectral": _spectral, "kernel": _kernel, "mechanisms": _mechanisms}
    return run.get(args.experiment, _norm_sweep)(args)


def cmd_bench_stability(args: argparse.Namespace) -> int:
    names = _subset(args.mechanisms, [n for n in available() if n != "softmax"], "mechanism(s)")
    _resolve(args, {"steps": (5, 20), "seeds": (1, 5), "length": (160, 512)})
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
    title = "# Instability score (Chen et al. 2021, Appendix F, Table 3)"
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
    known = [p[0] for p in SPECTRAL_PAIRS]
    names = _subset(args.mechanisms or ",".join(known), known, "mechanism(s)")
    _resolve(args, {"heads": (4, 4), "seeds": (2, 5),
                    "features": ((16, 64), (16, 32, 64, 128, 256)),
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
    title = "# Spectral-norm approximation error (Chen et al. 2021 §4.5, Fig. 1)"
    return _write(args.out, "spectral", rows, f"{title}\n\n{caption}.\n\n"
                  + spectral_markdown(rows), plot_spectral, caption)  # fmt: skip


def _write(out: Path, stem: str, rows: list, markdown: str, plot, caption: str) -> int:  # type: ignore[no-untyped-def]
    """``<stem>.csv``, ``.json`` (benchmark, machine, caption, rows), ``.md`` and ``.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.csv").write_text(rows_to_csv(rows))
    report = {
        "benchmark": stem,
        "machine": machine_info(),
        "caption": caption,
        "rows": [{k: _json_value(v) for k, v in asdict(r).items()} for r in rows],
    }
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    png = plot(rows, out / f"{stem}.png", caption)
    print(markdown)
    written = [f"{stem}.csv", f"{stem}.json", f"{stem}.md"] + ([f"{stem}.png"] if png else [])
    print(f"written to {out}: {', '.join(written)}")
    return 0


def _json_value(value: Any) -> Any:
    """``value`` with non-finite floats as None (strict JSON has no NaN or infinity)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


#: the norm-sweep caption's words for each way of drawing W
_SAMPLED = {
    "iid": "with i.i.d. N(0, I) rows (as in the paper)",
    "orthogonal": "with orthogonal rows in blocks of d, Gaussian norms",
    "sphere": "with i.i.d. rows uniform on the sphere of radius √d",
}


def _norm_sweep(args: argparse.Namespace) -> int:
    known = {v[0]: v for v in NORM_SWEEP_VARIANTS}
    chosen = _subset(args.variants or ",".join(known), list(known), "variant(s)")
    _resolve(args, {"keys": (1024, 1024), "seeds": (2, 10),
                    "features": ((4, 16, 64, 256), (4, 16, 64, 256, 1024)),
                    "radii": ((1, 3, 5), (1, 2, 3, 4, 5))})  # fmt: skip
    sampling = args.sampling or "iid"
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
            sampling=sampling,
        )
    info = machine_info()
    caption = (
        f"d={args.dim}, {args.keys} keys, one query, unit sphere × R; W {_SAMPLED[sampling]}; "
        f"mean over {args.seeds} seeds (bars: standard error of the mean). "
        f"kattn {info['kattn']}, torch {torch.__version__}"
    )
    markdown = f"# Norm sweep (Luo et al. 2021, Fig. 1b)\n\n{caption}.\n\n{rows_to_markdown(rows)}"
    return _write(args.out, "norm-sweep", rows, markdown, plot_norm_sweep, caption)


def _kernel(args: argparse.Namespace) -> int:
    known = {v.label: v for v in KERNEL_VARIANTS}
    chosen = _subset(args.variants or ",".join(known), list(known), "kernel variant(s)")
    _resolve(args, {"seeds": (2, 10), "keys": (64, 256),
                    "features": ((16, 64, 256), (16, 32, 64, 128, 256, 512))})  # fmt: skip
    rows = kernel_study(
        features=args.features,
        dim=args.dim,
        keys=args.keys,
        seeds=args.seeds,
        input_std=args.input_std,
        variants=tuple(known[name] for name in chosen),
        progress=lambda text: print(f"kernel: {text}", file=sys.stderr, flush=True),
    )
    info = machine_info()
    caption = (
        f"D={args.dim}, {args.keys} queries × {args.keys} keys with N(0, {args.input_std:.3g}²) "
        f"entries, kernels at the softmax scale q·k/√D; mean over {args.seeds} seeds (bars: "
        f"standard error), a fresh draw of inputs and features per seed. "
        f"kattn {info['kattn']}, torch {torch.__version__}"
    )
    title = "# Random-feature maps against their exact kernels"
    markdown = f"{title}\n\n{caption}.\n\n{kernel_markdown(rows)}"
    return _write(args.out, "kernel", rows, markdown, plot_kernel, caption)


def _mechanisms(args: argparse.Namespace) -> int:
    known = approximate_mechanisms()
    names = _subset(args.mechanisms or ",".join(known), known,
                    "approximate mechanism(s) (exact ones are the references)")  # fmt: skip
    _resolve(args, {"seeds": (1, 2), "heads": (2, 4), "lengths": ((192, 384), (256, 1024))})
    rows = mechanism_study(
        names,
        lengths=args.lengths,
        head_dim=args.dim,
        heads=args.heads,
        seeds=args.seeds,
        input_std=args.input_std,
        progress=lambda text: print(f"mechanisms: {text}", file=sys.stderr, flush=True),
    )
    info = machine_info()
    caption = (
        f"D=Dv={args.dim}, q, k entries N(0, {args.input_std:.3g}²), v N(0, 1); registered "
        f"defaults, eval(); mean over {args.heads} heads × {args.seeds} seeds (bars: standard "
        f"error). Dashed: no exact counterpart, compared with softmax for information. "
        f"kattn {info['kattn']}, torch {torch.__version__}"
    )
    title = "# Approximate mechanisms against their exact counterparts"
    markdown = f"{title}\n\n{caption}.\n\n{mechanism_markdown(rows)}"
    return _write(args.out, "mechanisms", rows, markdown, plot_mechanisms, caption)
