"""``kattn data ...`` subcommands: write the synthetic LRA tasks in their released formats
(:func:`kattn.data.generate_listops`, :func:`kattn.data.generate_pathfinder`).

``kattn data generate listops`` writes ``basic_{train,val,test}.tsv`` (LRA's ``listops-1000``)
and ``kattn data generate pathfinder`` one ``pathfinder32/<level>`` folder; the defaults are
those of the LRA release.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ..data.listops import generate_listops, write_listops
from ..data.pathfinder import LEVELS, generate_pathfinder


def add_data_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``data generate {listops,pathfinder}`` on the top-level subparsers."""
    data = sub.add_parser("data", help="generate the synthetic LRA datasets")
    actions = data.add_subparsers(dest="data_command", required=True)
    generate = actions.add_parser(
        "generate", help="write ListOps or Pathfinder in the LRA release's format"
    )
    datasets = generate.add_subparsers(dest="dataset", required=True, metavar="dataset")
    _add_listops_parser(datasets)
    _add_pathfinder_parser(datasets)


def _add_listops_parser(datasets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = datasets.add_parser(
        "listops",
        help="ListOps as basic_{train,val,test}.tsv (LRA's listops-1000)",
        description="LRA's ListOps generator: distinct random expressions strictly inside the "
        "length window, split in order of generation into train, valid and test, written as "
        "basic_{train,val,test}.tsv (header Source<TAB>Target). The defaults are LRA's; the "
        "same options and seed give byte-identical files.",
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", required=True, help="the folder to write the TSVs into"
    )
    p.add_argument(
        "--train", type=int, metavar="N", default=96_000, help="train examples (default 96000)"
    )
    p.add_argument(
        "--valid", type=int, metavar="N", default=2_000, help="valid examples (default 2000)"
    )
    p.add_argument(
        "--test", type=int, metavar="N", default=2_000, help="test examples (default 2000)"
    )
    p.add_argument(
        "--min-length",
        type=int,
        metavar="N",
        default=500,
        help="keep expressions longer than this many tokens (default 500)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        default=2_000,
        help="keep expressions shorter than this many tokens (default 2000)",
    )
    p.add_argument(
        "--max-depth",
        type=int,
        metavar="N",
        default=10,
        help="maximum nesting depth of an expression (default 10)",
    )
    p.add_argument(
        "--max-args",
        type=int,
        metavar="N",
        default=10,
        help="maximum arguments of an operator (default 10)",
    )
    p.add_argument(
        "--seed", type=int, metavar="N", default=0, help="seeds the generator (default 0)"
    )
    p.set_defaults(func=cmd_data_generate_listops)


def _add_pathfinder_parser(datasets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    levels = ", ".join(f"{n} = {name}" for n, name in sorted(LEVELS.items()))
    p = datasets.add_parser(
        "pathfinder",
        help="Pathfinder images as <level>/imgs/<batch>/sample_<i>.png + metadata",
        description="Balanced Pathfinder images (half label 1) written in the released "
        "layout: <out>/<level>/imgs/<batch>/sample_<i>.png and <out>/<level>/metadata/"
        f"<batch>.npy. Levels: {levels}. The same options and seed give the same files.",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        required=True,
        help="the pathfinder32 folder to write the level folder into",
    )
    p.add_argument(
        "--count",
        type=int,
        metavar="N",
        default=1_000,
        help="number of images, half of them label 1 (default 1000)",
    )
    p.add_argument(
        "--contour-length",
        type=int,
        choices=sorted(LEVELS),
        default=14,
        help=f"paddles per target contour ({levels}; default 14)",
    )
    p.add_argument(
        "--seed", type=int, metavar="N", default=0, help="seeds the generator (default 0)"
    )
    p.add_argument(
        "--image-size",
        type=int,
        metavar="N",
        default=32,
        help="image side in pixels, >= 16 (default 32)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        default=1_000,
        help="images per imgs/<batch> folder and metadata file (default 1000)",
    )
    p.set_defaults(func=cmd_data_generate_pathfinder)


def cmd_data_generate_listops(args: argparse.Namespace) -> int:
    total = args.train + args.valid + args.test
    print(
        f"generating {total} ListOps expressions of {args.min_length} < length < "
        f"{args.max_length} tokens (seed {args.seed}) ...",
        file=sys.stderr,
        flush=True,
    )
    splits = generate_listops(
        args.train,
        args.valid,
        args.test,
        min_length=args.min_length,
        max_length=args.max_length,
        max_depth=args.max_depth,
        max_args=args.max_args,
        seed=args.seed,
    )
    paths = write_listops(args.out, splits)
    for split, path in paths.items():
        print(f"wrote {path}: {len(splits[split])} examples")
    print(f"train classes: {_class_counts([label for _, label in splits['train']])}")
    print(_baseline([label for _, label in splits["test"]]))
    return 0


def _class_counts(labels: Sequence[int]) -> str:
    counts = Counter(labels)
    return ", ".join(f"{label}: {counts[label]}" for label in sorted(counts)) or "none"


def _baseline(labels: Sequence[int]) -> str:
    """The accuracy of always answering the most common test label."""
    if not labels:
        return "test split is empty: no majority-class baseline"
    label, count = Counter(labels).most_common(1)[0]
    share = count / len(labels)
    return f"majority-class baseline (test): {share:.2%} (always {label}, {count}/{len(labels)})"


def cmd_data_generate_pathfinder(args: argparse.Namespace) -> int:
    print(
        f"generating {args.count} Pathfinder images, contour length {args.contour_length}, "
        f"{args.image_size}x{args.image_size} (seed {args.seed}) ...",
        file=sys.stderr,
        flush=True,
    )
    level = generate_pathfinder(
        args.out,
        count=args.count,
        contour_length=args.contour_length,
        image_size=args.image_size,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    print(f"wrote {level}: {args.count} images")
    return 0
