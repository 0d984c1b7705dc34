"""The foundation speed paths of two versions of kattn, timed in one run (a change's before/after).

The version at ``--before`` (a git commit of this repository) is exported to a temporary folder;
the version after is this checkout's ``src/``. In each of ``--rounds`` rounds, one worker process
per version (in alternating order) builds the foundation benchmark's ``performer`` (D=Dv=64,
M=64, fp32, forward, B=H=1) and times each path of ``benchmarks/foundation_speed.py`` for about
``--seconds`` (median of the calls after two warm-up calls). Reported: per path, the median over
rounds for each version and the ratio after/before (1.0 = no change; above 1 = slower), with the
per-round ratio range, so a slowdown can be told from the machine's noise.

    python benchmarks/before_after.py --before abbde0f           # the committed results
    python benchmarks/before_after.py --before HEAD~1 --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def worker(src: str, length: int, seconds: float) -> dict[str, float]:
    """Median seconds per call of each foundation path, with kattn imported from ``src``."""
    sys.path[:0] = [src, str(HERE)]
    import torch

    import kattn
    from foundation_speed import candidates, inputs

    assert Path(kattn.__file__).is_relative_to(src), f"kattn came from {kattn.__file__}"
    torch.manual_seed(0)
    attn = kattn.build("performer", head_dim=64, num_heads=1, num_features=64).eval()
    medians = {}
    with torch.no_grad():
        for name, fn in candidates(attn, *inputs(length)).items():
            fn(), fn()
            times: list[float] = []
            deadline = time.perf_counter() + seconds
            while len(times) < 3 or time.perf_counter() < deadline:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            medians[name] = statistics.median(times)
    return medians


def export_commit(commit: str, into: Path) -> Path:
    """The ``src/`` folder of ``commit`` written under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_worker(src: Path, length: int, seconds: float) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", str(src), f"--length={length}"]
    out = subprocess.run([*cmd, f"--seconds={seconds}"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def render(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"# Foundation paths before and after ({cfg['before']} → {cfg['after']})",
        "",
        f"{report['machine']['processor']}; torch {report['machine']['torch']}. "
        f"performer D=Dv=64, M=64, fp32, forward, L={cfg['length']}; median of "
        f"{cfg['rounds']} alternating rounds, one process per version and round.",
        "",
        "| path | before (ms) | after (ms) | after / before | per-round range |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["paths"].items():
        low, high = min(row["round_ratios"]), max(row["round_ratios"])
        lines.append(
            f"| {name} | {row['before'] * 1e3:.2f} | {row['after'] * 1e3:.2f} | "
            f"{row['ratio']:.3f} | {low:.3f}–{high:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the git commit to compare with (e.g. abbde0f)")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per path per round")
    parser.add_argument("--quick", action="store_true", help="L=2048, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.seconds)))
        return
    if not args.before:
        parser.error("--before COMMIT is required")
    if args.quick:
        args.length, args.rounds, args.seconds = 2048, 2, 0.05
    sys.path.insert(0, str(ROOT / "src"))
    from kattn.bench import machine_info

    after_commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export_commit(args.before, Path(tmp)), "after": ROOT / "src"}
        rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
                rounds[label].append(run_worker(trees[label], args.length, args.seconds))
                print(f"round {r + 1}/{args.rounds} {label}: done", flush=True)
    paths = {}
    for name in rounds["before"][0]:
        before = statistics.median(x[name] for x in rounds["before"])
        after = statistics.median(x[name] for x in rounds["after"])
        per_round = [
            a[name] / b[name] for a, b in zip(rounds["after"], rounds["before"], strict=True)
        ]
        paths[name] = dict(before=before, after=after, ratio=after / before, round_ratios=per_round)
    report = {
        "machine": machine_info(),
        "config": {
            "before": args.before,
            "after": after_commit,
            "length": args.length,
            "rounds": args.rounds,
            "seconds": args.seconds,
        },
        "paths": paths,
        "round_seconds": rounds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"before-after-{args.before}-{after_commit}" + ("-quick" if args.quick else "")
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(render(report))
    print("\n" + render(report) + f"written: {args.out / stem}.{{json,md}}")


if __name__ == "__main__":
    main()
