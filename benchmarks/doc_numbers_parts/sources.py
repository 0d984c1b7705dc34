"""The committed result files that the docs' numbers come from: their paths, how to read
them, and how a page may cite them."""

from __future__ import annotations

import csv
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROCESSOR = "intel-r-xeon-r-processor-torch2.13.0-kattn0.1.0"
MACHINE = f"cpu-{PROCESSOR}"
R = "benchmarks/results"
FOUNDATION = f"{R}/foundation-{MACHINE}.json"
RPE = f"{R}/rpe-{MACHINE}.json"
RPE_BLOCKED = f"{R}/rpe-blocked-{MACHINE}.json"
NYSTROM = f"{R}/nystrom-{MACHINE}.json"
LEARNED = f"{R}/learned-{MACHINE}.json"
LM = f"{R}/lm-{MACHINE}.json"
SPEED = f"{R}/speed/speed-forward-float32-{MACHINE}.json"
SPEED_RPE = f"{R}/speed-rpe/speed-forward-float32-{MACHINE}.json"
MECHANISMS = f"{R}/mechanisms/mechanisms.json"
NORM_SWEEP = f"{R}/norm-sweep/norm-sweep.csv"
SPECTRAL = f"{R}/spectral/spectral.csv"
STABILITY = f"{R}/stability/stability.json"
PINV_INIT = f"{R}/pinv-init-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"
SPARSE = f"{R}/sparse-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"
SPARSE_LISTOPS_RUNS = tuple(
    f"{R}/listops-sparse/{name}/results.json"
    for name in ("softmax", "local", "longformer", "bigbird", "sparse_transformer")
)
BASELINES = f"{R}/baselines-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"
SEQ2SEQ_DECODE = f"{R}/seq2seq-decode-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"
TRANSLATION_RUNS = tuple(
    f"{R}/translation/{name}/results.json"
    for name in ("softmax", "performer-decoder", "performer", "nprf_rpe")
)
STUDY_CONVERSION = f"{R}/translation/study-conversion/study.json"
STUDY_FEATURE_DIM = f"{R}/translation/study-feature-dim/study.json"
STUDY_FEATURE_MAP = f"{R}/translation/study-feature-map/study.json"
VISION_CLS_RUNS = tuple(
    f"{R}/vision/{run}{seed}/results.json"
    for run in ("cls-softmax", "cls-nprf", "cls-nprf_rpe")
    for seed in ("", "-seed1", "-seed2")
)
VISION_GEN_RUNS = tuple(
    f"{R}/vision/{name}/results.json" for name in ("gen-softmax", "gen-nprf_rpe")
)
VIT_SPEED = f"{R}/vit-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"
BASELINE_NAMES = ("reformer", "smyrf", "clustered", "improved_clustered", "sinkhorn",
                  "synthesizer", "informer", "rfa_gate")  # fmt: skip
BASELINE_LISTOPS_RUNS = tuple(f"{R}/listops-baselines/{n}/results.json" for n in BASELINE_NAMES)
DEMO_REPORT = f"{R}/demo/report.md"
DEMO_TIME = f"{R}/demo/make-demo.json"
BENCH_TIME = f"{R}/make-bench.json"
DEMO_TRAINED = ("softmax", "performer", "nprf_rpe", "skyformer", "gmm_prf")
DEMO_RUNS = tuple(f"{R}/demo/train/{name}/results.json" for name in DEMO_TRAINED)


@cache
def load(path: str) -> Any:
    """A result file: JSON as parsed, CSV as a list of rows (numbers converted), markdown and
    plain text as their text."""
    file = ROOT / path
    if path.endswith((".md", ".txt")):
        return file.read_text()
    if path.endswith(".csv"):
        with file.open(newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return json.loads(file.read_text())


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def cited_as(path: str) -> tuple[str, ...]:
    """How a page may cite ``path``: the path, its other format (.md/.json), its folders below
    ``benchmarks/results/`` (a study in its own folder), or the name with ``*`` (or ``…``) for
    the processor and versions."""
    names = {path, re.sub(r"\.json$", ".md", path)}
    parts = path.split("/")
    for depth in range(3, len(parts)):  # benchmarks/results/<study>/…/<file>: each folder
        names.add("/".join(parts[:depth]) + "/")
    names |= {n.replace(PROCESSOR, "*") for n in names}
    names |= {n.split(PROCESSOR)[0] + "…" for n in names if PROCESSOR in n}
    return tuple(sorted(names))


def ratio_cell(r: dict | None) -> str:
    """A ratio of medians with its per-round range, ``"1.23× (1.10–1.40)"``; ``"—"`` for
    none."""
    if r is None:
        return "—"
    return f"{r['value']:.2f}× ({min(r['rounds']):.2f}–{max(r['rounds']):.2f})"


def mib(nbytes: float) -> float:
    return nbytes / 2**20
