"""``benchmarks/pinv_init.py`` runs end to end (``--quick``) and writes its tables."""

import json

import pytest

from .test_benchmark_scripts import run_quick


@pytest.mark.slow
def test_pinv_init_quick_run_writes_results(tmp_path):
    run_quick("pinv_init.py", tmp_path)
    (md,) = tmp_path.glob("pinv-init-*-quick.md")
    (js,) = tmp_path.glob("pinv-init-*-quick.json")
    report = json.loads(js.read_text())
    rows = {r["init"]: r for r in report["approximation"]}
    assert set(rows) == {"identity", "global", "per_matrix", "exact inverse"}
    # L = 64 with 128 landmarks: every row is one, and six steps from I invert the core
    assert rows["identity"]["inverse"] < 1e-8 < rows["per_matrix"]["inverse"]
    summary = report["training"]["summary"]
    assert set(summary) == {"identity", "global", "per_matrix"}
    assert all(len(r["losses"]) == 20 for runs in report["training"]["runs"].values() for r in runs)
    assert "| 64 | identity |" in md.read_text()
