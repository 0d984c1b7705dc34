"""benchmarks/hf_decode.py runs end to end (``--quick``) and writes its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_results(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "hf_decode.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
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
    assert "| llama | `kattn:nprf_rpe` |" in md.read_text()
