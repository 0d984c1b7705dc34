"""``kattn bench speed``: time and peak memory of every mechanism against softmax
(:mod:`kattn.bench.speed`, results written by :mod:`kattn.bench.speed_report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench.speed import DTYPES, PASSES, SpeedConfig
from ..bench.speed_report import benchmark_speed
from .types import device, int_at_least, int_list, name_list, output_folder, positive_float


def add_speed_parser(kinds: argparse._SubParsersAction) -> None:
    """Add ``speed`` to the ``kattn bench`` subcommands."""
    p = kinds.add_parser(
        "speed",
        help="time and peak memory of every mechanism against softmax, as the length grows",
        description="Each mechanism is first checked against its own float64 dense reference "
        "(output, and input gradients when a backward pass is timed), then timed in "
        "interleaved rounds with softmax (median of round medians; CUDA events on GPU) and "
        "its peak memory measured (CUDA allocator on GPU, tracked allocations on CPU). A "
        "length is skipped where the call is predicted (from the mechanism's complexity and "
        "its fastest round at the previous length) to pass --max-call-seconds, or its peak "
        "memory to pass --memory-limit-gb; the table marks it and says why. Writes CSV, JSON, "
        "a markdown table with the crossover length against softmax and a log-log plot; file "
        "names carry the device and the library versions.",
    )
    p.add_argument("--mechanisms", type=name_list, default=None,
                   help="comma-separated names (default: all)")  # fmt: skip
    p.add_argument("--lengths", type=int_list(2), default=None, help="default 256,1024,4096")
    p.add_argument("--batch", type=int_at_least(1), default=1)
    p.add_argument("--heads", type=int_at_least(1), default=4)
    p.add_argument("--head-dim", type=int_at_least(1), default=64)
    p.add_argument(
        "--features",
        type=int_at_least(1),
        default=None,
        help="the approximation size M of every mechanism that has one (num_features, "
        "num_landmarks or proj_dim; default: each mechanism's own default)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--pass", dest="mode", choices=PASSES, default="forward",
                   help="forward (no graph), backward (the backward alone) or both")  # fmt: skip
    p.add_argument("--causal", action="store_true", help="causal attention (skips the others)")
    p.add_argument("--repeats", type=int_at_least(1), default=None,
                   help="interleaved rounds (default 5)")  # fmt: skip
    p.add_argument("--seconds", type=positive_float, default=None,
                   help="time per round and mechanism (default 0.3)")  # fmt: skip
    p.add_argument("--check-max-length", type=int_at_least(0), default=2048,
                   help="check against the dense reference up to this length")  # fmt: skip
    p.add_argument("--max-call-seconds", type=positive_float, default=2.0,
                   help="skip a length where one call is predicted to take longer (the "
                   "fastest round at the previous length times the growth of the mechanism's "
                   "complexity)")  # fmt: skip
    p.add_argument("--memory-limit-gb", type=positive_float, default=8.0,
                   help="skip a length where peak memory is predicted to pass this")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_folder, default=Path("runs/bench/speed"))
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: lengths 128,256,512, 3 rounds of 0.05 s")  # fmt: skip
    p.set_defaults(func=cmd_bench_speed)


def config_from_args(args: argparse.Namespace) -> SpeedConfig:
    """The benchmark's settings from the flags; --quick sets smaller defaults."""
    quick = bool(args.quick)
    return SpeedConfig(
        mechanisms=tuple(args.mechanisms.split(",")) if args.mechanisms else (),
        lengths=args.lengths or ((128, 256, 512) if quick else (256, 1024, 4096)),
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        features=args.features,
        dtype=args.dtype,
        device=args.device,
        mode=args.mode,
        causal=args.causal,
        rounds=args.repeats or (3 if quick else 5),
        seconds=args.seconds or (0.05 if quick else 0.3),
        check_max_length=args.check_max_length,
        max_call_seconds=args.max_call_seconds,
        memory_limit_bytes=int(args.memory_limit_gb * 2**30),
        seed=args.seed,
    )


def cmd_bench_speed(args: argparse.Namespace) -> int:
    run = benchmark_speed(
        config_from_args(args),
        args.out,
        progress=lambda text: print(f"speed: {text}", file=sys.stderr, flush=True),
    )
    print(run.markdown)
    print(f"written: {', '.join(str(p) for p in run.paths)}")
    return 1 if run.failed else 0
