"""``kattn demo --quick``: every mechanism measured, a few trained, one report."""

from __future__ import annotations

import dataclasses
import json

import torch

import kattn
import kattn.bench.demo as demo
from kattn.bench.demo import QUICK, redraw_plan, run_training
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
    assert "Training runs: each ran in a fresh process of its own" in report
    for plot in ("speed", "approx/mechanisms", "report-training"):
        assert plot in report
    assert (out / "train" / "performer" / "results.json").exists()
    assert len(list((out / "speed").glob("speed-forward-float32-cpu-*.png"))) == 1


def test_unknown_trained_mechanism_is_refused(capsys):
    assert main(["demo", "--quick", "--train", "softmax,nope"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err


def test_a_redraw_that_would_fall_on_the_last_step_is_turned_off():
    options, note = redraw_plan("performer", 1000)
    assert options == {"redraw": "never"} and "would come only at the last step" in note
    assert redraw_plan("nprf_rpe", 1000)[0] == {"redraw": "never"}
    assert redraw_plan("gmm_prf", 100)[0] == {"resample_every": "never"}
    assert redraw_plan("performer", 2500) == (
        {},
        "performer draws its random features anew every 1000 training steps",
    )
    assert redraw_plan("gmm_prf", 1000)[1] == (
        "gmm_prf draws its random features anew every 100 training steps, the last time at "
        "step 1000, just before the last evaluation"
    )
    assert redraw_plan("performer", 999) == ({}, None)  # no redraw within the run
    assert redraw_plan("softmax", 1000) == ({}, None)


def test_each_training_run_reports_its_own_peak_memory(tmp_path, monkeypatch):
    # the test's own process peaks past 1.5 GiB first: a run measured in it would say so too
    big = torch.ones(384 * 2**20)
    del big
    plan = dataclasses.replace(QUICK, train_steps=2, eval_every=2)
    monkeypatch.setattr(demo, "redraw_plan", lambda name, steps: ({"redraw": "never"}, None)
                        if name == "performer" else ({}, None))  # fmt: skip
    results = run_training(tmp_path, plan, ("softmax", "performer"))
    for name, found in results.items():
        assert found["peak_memory_kind"] == "max_rss"
        assert 100 * 2**20 < found["peak_memory_bytes"] < 2**30, name
    config = json.loads((tmp_path / "performer" / "config.json").read_text())
    assert config["attention"]["options"]["redraw"] == "never"  # the plan reaches the run
