"""The benchmark scripts run end to end (``--quick``) and write their tables."""

import json
import subprocess
import sys
from pathlib import Path

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


def test_nystrom_speed_quick_run_writes_results(tmp_path):
    run_quick("nystrom_speed.py", tmp_path)
    (md,) = tmp_path.glob("nystrom-*-quick.md")
    (js,) = tmp_path.glob("nystrom-*-quick.json")
    report = json.loads(js.read_text())
    assert set(report["seconds"]) == {"256", "512"}
    assert report["correctness"]["skyformer"] < 1e-3
    text = md.read_text()
    assert "| 512 | skyformer |" in text and "Peak memory (MiB)" in text


def test_learned_speed_quick_run_writes_results(tmp_path):
    run_quick("learned_speed.py", tmp_path)
    (md,) = tmp_path.glob("learned-*-quick.md")
    (js,) = tmp_path.glob("learned-*-quick.json")
    report = json.loads(js.read_text())
    names = set(report["seconds"]["512"])
    assert {"softmax", "gmm_rks", "fastfood_prf", "ffk_vae", "simpletron"} <= names
    assert max(report["correctness"].values()) < 1e-6
    assert "| `fastfood_prf` | 64 |" in md.read_text()


def test_lm_speed_quick_run_writes_results(tmp_path):
    run_quick("lm_speed.py", tmp_path)
    (md,) = tmp_path.glob("lm-*-quick.md")
    (js,) = tmp_path.glob("lm-*-quick.json")
    report = json.loads(js.read_text())
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
    text = md.read_text()
    assert "| 512 | 2 | no attention (ceiling) |" in text and "## Targets" in text


def test_rpe_blocked_speed_quick_run_writes_results(tmp_path):
    run_quick("rpe_blocked_speed.py", tmp_path)
    (md,) = tmp_path.glob("rpe-blocked-*-quick.md")
    (js,) = tmp_path.glob("rpe-blocked-*-quick.json")
    rows = json.loads(js.read_text())["rows"]
    assert {(r["length"], r["mode"]) for r in rows} == {
        (n, mode) for n in (128, 256) for mode in ("forward", "forward causal", "train causal")
    }
    assert all(r["blocked_seconds"] > 0 and r["fft_seconds"] > 0 for r in rows)
    assert "| 16 | 256 | train causal |" in md.read_text()


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
