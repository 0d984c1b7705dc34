"""``kattn bench approx`` and ``kattn bench stability`` (the studies of
:mod:`kattn.bench.experiments`); ``kattn bench speed`` is in :mod:`kattn.cli.speed`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bench.approx import NORM_SWEEP_VARIANTS, SAMPLINGS
from ..bench.experiments import (
    EXPERIMENTS,
    StudyOutput,
    run_kernel,
    run_mechanisms,
    run_norm_sweep,
    run_spectral,
    run_stability,
)
from ..bench.kernel_error import KERNEL_VARIANTS
from ..bench.spectral import BERT_INIT_STD, SPECTRAL_PAIRS
from ..bench.stability import LEARNING_RATE, TABLE3_MECHANISMS
from .speed import add_speed_parser
from .types import (
    int_at_least,
    int_list,
    name_list,
    output_folder,
    positive_float,
    positive_float_list,
)

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
#: the defaults of the options left unset, ``(with --quick, without)``
_DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "norm-sweep": {"keys": (1024, 1024), "seeds": (2, 10),
                   "features": ((4, 16, 64, 256), (4, 16, 64, 256, 1024)),
                   "radii": ((1, 3, 5), (1, 2, 3, 4, 5))},
    "spectral": {"heads": (4, 4), "seeds": (2, 5), "features": ((16, 64), (16, 32, 64, 128, 256)),
                 "lengths": ((128, 256), (256, 512, 1024))},
    "kernel": {"seeds": (2, 10), "keys": (64, 256),
               "features": ((16, 64, 256), (16, 32, 64, 128, 256, 512))},
    "mechanisms": {"seeds": (1, 2), "heads": (2, 4), "lengths": ((192, 384), (256, 1024))},
    "stability": {"steps": (5, 20), "seeds": (1, 5), "length": (160, 512)},
}  # fmt: skip


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench speed|approx|stability`` to the ``kattn`` subcommands."""
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


def _resolve(args: argparse.Namespace, experiment: str) -> None:
    """Fill the options left unset (None) with their ``(quick, full)`` default and check that
    every number given is >= 1."""
    for key, (small, full) in _DEFAULTS[experiment].items():
        value = getattr(args, key)
        if value is None:
            setattr(args, key, small if args.quick else full)
        elif any(x < 1 for x in (value if isinstance(value, tuple) else (value,))):
            raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {value}")


def _names(text: str | None) -> list[str] | None:
    """The names of a comma-separated option (None: not given)."""
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _progress(label: str) -> Callable[[str], None]:
    return lambda text: print(f"{label}: {text}", file=sys.stderr, flush=True)


def _show(found: StudyOutput) -> int:
    print(found.markdown)
    print(f"written to {found.out}: {', '.join(found.files)}")
    return 0


def _spectral(args: argparse.Namespace) -> StudyOutput:
    return run_spectral(
        args.out,
        lengths=args.lengths,
        features=args.features,
        dim=args.dim,
        heads=args.heads,
        seeds=args.seeds,
        input_std=args.input_std,
        mechanisms=_names(args.mechanisms),
        progress=_progress("spectral"),
    )


def _kernel(args: argparse.Namespace) -> StudyOutput:
    return run_kernel(
        args.out,
        features=args.features,
        dim=args.dim,
        keys=args.keys,
        seeds=args.seeds,
        input_std=args.input_std,
        variants=_names(args.variants),
        progress=_progress("kernel"),
    )


def _mechanisms(args: argparse.Namespace) -> StudyOutput:
    return run_mechanisms(
        args.out,
        lengths=args.lengths,
        dim=args.dim,
        heads=args.heads,
        seeds=args.seeds,
        input_std=args.input_std,
        mechanisms=_names(args.mechanisms),
        progress=_progress("mechanisms"),
    )


def _norm_sweep(args: argparse.Namespace) -> StudyOutput:
    return run_norm_sweep(
        args.out,
        radii=args.radii,
        features=args.features,
        dim=args.dim,
        keys=args.keys,
        seeds=args.seeds,
        variants=_names(args.variants),
        sampling=args.sampling or "iid",
        progress=_progress("norm-sweep"),
    )


#: the study each ``--experiment`` runs
_STUDIES: dict[str, Callable[[argparse.Namespace], StudyOutput]] = {
    "norm-sweep": _norm_sweep, "spectral": _spectral, "kernel": _kernel,
    "mechanisms": _mechanisms,
}  # fmt: skip


def cmd_bench_approx(args: argparse.Namespace) -> int:
    for option, experiments in _APPLIES.items():
        if getattr(args, option) is not None and args.experiment not in experiments:
            raise ValueError(
                f"--{option.replace('_', '-')} applies to --experiment "
                f"{' or '.join(experiments)}, not {args.experiment}"
            )
    if args.input_std is None:
        args.input_std = BERT_INIT_STD
    _resolve(args, args.experiment)
    return _show(_STUDIES[args.experiment](args))


def cmd_bench_stability(args: argparse.Namespace) -> int:
    _resolve(args, "stability")
    found = run_stability(args.out, mechanisms=_names(args.mechanisms) or [], steps=args.steps,
                          seeds=args.seeds, batch=args.batch, length=args.length, lr=args.lr,
                          progress=_progress("stability"))  # fmt: skip
    return _show(found)
