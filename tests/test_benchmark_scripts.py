"""The benchmark scripts run end to end (``--quick``) and write their tables."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, out: Path) -> None:
    """Run ``benchmarks/<script> --quick --out <out>``; it must succeed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def quick_results(script: str, stem: str, out: Path) -> tuple[dict, str]:
    """:func:`run_quick`, then the report and the markdown of the one ``<stem>-*-quick.json``
    and ``.md`` it wrote."""
    run_quick(script, out)
    (js,) = out.glob(f"{stem}-*-quick.json")
    (md,) = out.glob(f"{stem}-*-quick.md")
    return json.loads(js.read_text()), md.read_text()


def test_foundation_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("foundation_speed.py", "foundation", tmp_path)
    assert set(report["ratios"]) == set(report["targets"]) == set(report["round_ratios"])
    assert max(report["correctness"].values()) < 1e-4
    assert set(report["peak_memory_bytes"]) == {"512", "1024", "2048"}
    assert "| performer causal |" in text and "threads; torch" in text


def test_rpe_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("rpe_speed.py", "rpe", tmp_path)
    assert set(report["sweep_seconds"]) == {"256", "1024", "2048"}
    assert set(report["ratios"]) == set(report["targets"])
    assert max(report["correctness_max_abs_error"].values()) < 1e-4
    assert "## At L = 2048" in text and "threads; torch" in text


def test_nystrom_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("nystrom_speed.py", "nystrom", tmp_path)
    assert set(report["seconds"]) == {"256", "512"}
    assert report["correctness"]["skyformer"] < 1e-3
    assert "| 512 | skyformer |" in text and "Peak memory (MiB)" in text


def test_learned_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("learned_speed.py", "learned", tmp_path)
    names = set(report["seconds"]["512"])
    assert {"softmax", "gmm_rks", "fastfood_prf", "ffk_vae", "simpletron"} <= names
    assert max(report["correctness"].values()) < 1e-6
    assert "| `fastfood_prf` | 64 |" in text


def test_lm_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("lm_speed.py", "lm", tmp_path)
    assert {(r["context"], r["mechanism"]) for r in report["decode"]} >= {
        (256, "softmax"),
        (256, "nprf_rpe decay M=64"),
    }
    assert max(report["correctness_max_abs_error"].values()) < 1e-4
    cache = next(r for r in report["decode"] if r["mechanism"] == "softmax")
    assert cache["state_bytes_filled"] < cache["state_bytes_allocated"]
    assert {r["block"] for r in report["train"]} == {256, 512}
    assert {r["batch"] for r in report["train"]} == {4, 2}
    assert len(report["targets"]) == 4
    assert "| 512 | 2 | no attention (ceiling) |" in text and "## Targets" in text


def test_rpe_blocked_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("rpe_blocked_speed.py", "rpe-blocked", tmp_path)
    rows = report["rows"]
    assert {(r["length"], r["mode"]) for r in rows} == {
        (n, mode) for n in (128, 256) for mode in ("forward", "forward causal", "train causal")
    }
    assert all(r["blocked_seconds"] > 0 and r["fft_seconds"] > 0 for r in rows)
    assert "| 16 | 256 | train causal |" in text


def test_before_after_quick_run_compares_two_versions(tmp_path):
    script = ROOT / "benchmarks" / "before_after.py"
    done = subprocess.run(
        [sys.executable, str(script), "--before", "HEAD", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (js,) = tmp_path.glob("before-after-HEAD-*-quick.json")
    report = json.loads(js.read_text())
    assert set(report["paths"]) == {"performer causal", "softmax causal", "cumsum causal",
                                    "performer", "softmax"}  # fmt: skip
    for row in report["paths"].values():
        assert len(row["round_ratios"]) == 2 and row["ratio"] > 0
    assert len(report["round_seconds"]["before"]) == len(report["round_seconds"]["after"]) == 2


def import_benchmark(name: str):
    """``benchmarks/<name>.py``, imported as its scripts import it (``benchmarks/`` on the
    path)."""
    benchmarks = str(ROOT / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(benchmarks)


def _sparse_speed_report():
    return import_benchmark("sparse_speed_report")


@pytest.mark.parametrize("length", [1, 5, 17, 64])
@pytest.mark.parametrize(("back", "fwd"), [(0, 0), (3, 2), (8, 0), (100, 100)])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_band_keys_count_the_band_entry_by_entry(length, back, fwd, causal):
    report = _sparse_speed_report()
    expected = sum(
        1
        for i in range(length)
        for j in range(length)
        if i - back <= j <= i + fwd and (j <= i or not causal)
    )
    assert report.band_keys(length, back, fwd, causal) == expected


def test_sparse_flop_bound_and_dense_memory_cap():
    report = _sparse_speed_report()
    # window 256 away from the edges: 256 keys per query, D = Dv = 64, B = 1, H = 4
    assert report.band_flops(16384 * 256, 1, 4, 64, 64) == 2 * 4 * 16384 * 256 * 128
    assert report.score_bytes(16384, 1, 4) == 4 * 2**30
    assert report.dense_fits(16384, 1, 4, 4 * 2**30)
    assert not report.dense_fits(65536, 1, 4, 4 * 2**30)


def test_sparse_targets_read_speedups_bound_and_decoding():
    report = _sparse_speed_report()
    run = {
        "forward_seconds": {"16384": {"sdpa": 3.0, "local": 0.15, "bigbird": 1.0}},
        "local_bound": {"16384": {"ratio": 2.5}},
        "decode": [
            {"mechanism": "local", "context": 32768, "step_seconds": 1.5e-4},
            {"mechanism": "local", "context": 512, "step_seconds": 1e-4},
        ],
    }
    got = {t["name"].split(" at ")[0]: (t["value"], t["met"]) for t in report.targets(run)}
    assert got["local forward speed-up over SDPA"] == (pytest.approx(20.0), True)
    assert got["bigbird forward speed-up over SDPA"] == (pytest.approx(3.0), False)
    assert got["longformer forward speed-up over SDPA"] == (None, None)
    assert got["local forward time / FLOP bound"] == (2.5, True)
    decoding = got["local decoding: time per token, longest / shortest context"]
    assert decoding == (pytest.approx(1.5), False)


def test_sparse_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("sparse_speed.py", "sparse", tmp_path)
    assert set(report["forward_seconds"]) == set(report["train_seconds"]) == {"256", "512"}
    assert {"sdpa", "local"} <= set(report["forward_seconds"]["512"])
    assert max(report["correctness"].values()) < 1e-4
    assert set(report["local_bound"]) == {"256", "512"}
    assert {(r["mechanism"], r["context"]) for r in report["decode"]} == {
        (m, c) for m in ("local", "softmax") for c in (64, 256)
    }
    assert "## `local` against its FLOP lower bound" in text and "## Targets" in text


def test_baselines_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("baselines_speed.py", "baselines", tmp_path)
    names = set(report["train_seconds"]["512"])
    assert {"sdpa", "reformer", "clustered", "informer", "rfa_gate causal"} <= names
    assert max(report["correctness"].values()) < 1e-6  # fast paths against their references
    assert "| target | measured | goal | met |" in text
    assert report["config"]["malloc"]["MALLOC_TRIM_THRESHOLD_"]  # re-run under steady malloc


def test_rfa_gate_speed_quick_run_writes_results(tmp_path):
    report, text = quick_results("rfa_gate_speed.py", "rfa-gate", tmp_path)
    assert report and text.startswith("#")
