"""``kattn demo --quick``: every mechanism measured, a few trained, one report."""

from __future__ import annotations

import kattn
from kattn.cli import main


def test_quick_demo_measures_every_mechanism_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--train", "softmax,performer"]) == 0
    printed = capsys.readouterr().out
    summary = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(summary) == 1 + len(kattn.available())  # the header, one row per mechanism
    rows = {line.split(" | ")[0][2:]: line for line in summary[1:]}
    assert set(rows) == set(kattn.available())
    assert rows["softmax"].startswith("| softmax | exact | 1.00× | 1.00× | baseline |")
    assert rows["performer"].rstrip(" |").endswith("%")  # trained: its test accuracy
    assert not rows["linformer"].rstrip().endswith("% |")  # not trained
    report = (out / "report.md").read_text()
    assert report.startswith("# kattn demo") and "## Training runs" in report
    assert "## Summary" in report and "(no table" not in report
    for plot in ("speed", "approx/mechanisms", "report-training"):
        assert plot in report
    assert (out / "train" / "performer" / "results.json").exists()
    assert len(list((out / "speed").glob("speed-forward-float32-cpu-*.png"))) == 1


def test_unknown_trained_mechanism_is_refused(capsys):
    assert main(["demo", "--quick", "--train", "softmax,nope"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err
