"""``kattn bench speed``: checked before timed, ratios to softmax, skips, crossovers, files."""

from __future__ import annotations

import json

import pytest
import torch

from kattn.attention.kernelized import KernelizedAttention
from kattn.bench.speed import (
    SpeedConfig,
    SpeedRow,
    _predict,
    crossovers,
    measure_speed,
    size_options,
)
from kattn.cli import main

TINY = {"lengths": (32, 64), "heads": 2, "head_dim": 16, "rounds": 1, "seconds": 0.001}


def by_key(rows):
    return {(r.mechanism, r.length): r for r in rows}


def test_every_mechanism_is_checked_then_timed_against_softmax():
    names = ("performer", "nprf_rpe", "skyformer", "linformer", "gaussian")
    rows = measure_speed(SpeedConfig(mechanisms=names, **TINY))
    assert len(rows) == 2 * (len(names) + 1)  # softmax added as the baseline
    for row in rows:
        assert row.status == "ok", (row.mechanism, row.status)
        assert row.time_ms > 0 and row.peak_memory_mib > 0
        assert row.check_error is not None and row.check_error < 1e-3
        assert row.checked_at == row.length
    base = by_key(rows)["softmax", 64]
    assert base.speedup == pytest.approx(1.0) and base.memory_ratio == pytest.approx(1.0)
    performer = by_key(rows)["performer", 64]
    assert performer.speedup == pytest.approx(base.time_ms / performer.time_ms)


@pytest.mark.parametrize("mode", ["backward", "both"])
def test_backward_passes_check_gradients_too(mode):
    rows = measure_speed(SpeedConfig(mechanisms=("performer", "skyformer"), mode=mode, **TINY))
    assert all(r.status == "ok" and r.check_error < 1e-3 for r in rows)


def test_a_wrong_fast_path_fails_its_check_and_is_not_timed(monkeypatch, capsys, tmp_path):
    attend = KernelizedAttention._attend

    def broken(self, q, k, v, **kwargs):
        return attend(self, q, k, v, **kwargs) + 0.1

    monkeypatch.setattr(KernelizedAttention, "_attend", broken)
    rows = measure_speed(SpeedConfig(mechanisms=("performer", "linformer"), **TINY))
    performer = by_key(rows)["performer", 32]
    assert performer.status.startswith("check failed") and performer.time_ms is None
    assert by_key(rows)["linformer", 32].status == "ok"
    argv = ["bench", "speed", "--quick", "--mechanisms", "performer", "--lengths", "32",
            "--heads", "1", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 1


def test_causal_skips_mechanisms_without_a_causal_form():
    rows = measure_speed(SpeedConfig(mechanisms=("performer", "skyformer"), causal=True, **TINY))
    assert by_key(rows)["skyformer", 32].status.startswith("unsupported")
    assert by_key(rows)["performer", 64].status == "ok"


def test_lengths_predicted_past_the_limits_are_skipped():
    config = SpeedConfig(mechanisms=("gaussian",), **{**TINY, "lengths": (32, 64, 4096)},
                         memory_limit_bytes=1 << 20, max_call_seconds=1e6)  # fmt: skip
    rows = by_key(measure_speed(config))
    assert rows["gaussian", 32].status == "ok"
    assert "memory limit" in rows["gaussian", 4096].skipped
    assert rows["gaussian", 4096].status.startswith("skipped: predicted")
    assert rows["gaussian", 4096].time_ms is None


def test_size_option_reaches_the_mechanisms_that_have_one():
    assert size_options("performer", 32) == {"num_features": 32}
    assert size_options("skyformer", 32) == {"num_landmarks": 32}
    assert size_options("linformer", 32) == {"proj_dim": 32}
    assert size_options("softmax", 32) == {} and size_options("performer", None) == {}


def test_prediction_follows_the_measured_power_law():
    assert _predict([(100, 1.0), (200, 4.0)], 400) == pytest.approx(16.0)
    assert _predict([(100, 1.0), (200, 1.0)], 400) == pytest.approx(2.0)  # at least linear
    assert _predict([], 400) == 0.0


def test_crossover_is_interpolated_in_log_log():
    def row(name, length, speedup):
        return SpeedRow(name, length, speedup=speedup, time_ms=1.0)

    rows = [row("a", 256, 0.5), row("a", 1024, 2.0), row("b", 256, 2.0), row("b", 1024, 3.0),
            row("c", 256, 0.5), row("c", 1024, 0.9), row("d", 256, None)]  # fmt: skip
    found = {c.mechanism: c for c in crossovers(rows)}
    assert found["a"].kind == "at" and found["a"].length == pytest.approx(512.0)
    assert found["b"].kind == "below" and found["c"].kind == "above"
    assert found["d"].kind == "none" and found["d"].describe() == "n/a"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown mechanism"):
        SpeedConfig(mechanisms=("nope",))
    with pytest.raises(ValueError, match="pass"):
        SpeedConfig(mode="sideways")
    with pytest.raises(ValueError, match="lengths"):
        SpeedConfig(lengths=())


def test_cli_writes_csv_json_markdown_and_plot(tmp_path, capsys):
    argv = ["bench", "speed", "--quick", "--mechanisms", "performer,linformer", "--lengths",
            "32,64", "--heads", "1", "--head-dim", "16", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "faster than softmax from L" in out and "| performer |" in out
    stems = {p.stem for p in tmp_path.iterdir()}
    (stem,) = stems
    assert stem.startswith("speed-forward-float32-cpu-") and f"torch{torch.__version__[:4]}" in stem
    assert {p.suffix for p in tmp_path.iterdir()} == {".csv", ".json", ".md", ".png"}
    report = json.loads((tmp_path / f"{stem}.json").read_text())
    assert report["benchmark"] == "speed" and report["machine"]["torch"] == torch.__version__
    assert len(report["rows"]) == 6 and {c["mechanism"] for c in report["crossovers"]} == {
        "performer",
        "linformer",
    }
    csv_lines = (tmp_path / f"{stem}.csv").read_text().splitlines()
    assert len(csv_lines) == 7 and "time_ms" in csv_lines[0]


def test_cli_refuses_cuda_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "speed", "--device", "cuda"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device" in err and "CUDA is not available" in err
