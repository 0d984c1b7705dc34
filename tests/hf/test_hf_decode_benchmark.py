"""benchmarks/hf_decode.py runs end to end (``--quick``) and writes its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..test_benchmark_scripts import run_quick

pytest.importorskip("transformers")


def test_quick_run_writes_results(tmp_path: Path) -> None:
    run_quick("hf_decode.py", tmp_path)
    (js,) = tmp_path.glob("hf-decode-*-quick.json")
    (md,) = tmp_path.glob("hf-decode-*-quick.md")
    report = json.loads(js.read_text())
    assert {g["new_tokens"] for g in report["generation"]} == {10}
    layers = {(r["implementation"], r["cache_layer"]) for r in report["rows"]}
    assert layers == {
        ("sdpa", "DynamicLayer"),
        ("kattn:performer", "RecurrentLayer"),
        ("kattn:nprf_rpe", "RecurrentLayer"),
    }
    assert {r["context"] for r in report["rows"]} == {16, 32}
    # each round's steps follow the stated context, not the steps of the rounds before
    assert all(r["context_per_round"] == [r["context"]] * 2 for r in report["rows"])
    assert "| llama | `kattn:nprf_rpe` |" in md.read_text()
