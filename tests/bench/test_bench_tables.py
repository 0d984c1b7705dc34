"""Every markdown table kattn writes renders: as many delimiter cells as header cells, and as
many cells in every row. Each writer runs on a few hand-made rows; the scripts' renderers and
every committed result file are read as they are."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from kattn.bench.approx import SweepRow, rows_to_markdown
from kattn.bench.demo import summary_table
from kattn.bench.kernel_error import KernelRow, kernel_markdown
from kattn.bench.mechanism_error import MechanismRow, mechanism_markdown
from kattn.bench.report import build_report, lm_table, runs_table
from kattn.bench.spectral import SpectralRow, spectral_markdown
from kattn.bench.speed import SpeedConfig, SpeedRow
from kattn.bench.speed_report import render_speed_report, speed_markdown, write_speed
from kattn.bench.stability import StepScore, stability_markdown

from ..markdown_tables import cells, check_tables

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INFO = {"processor": "test CPU", "torch_threads": 2, "kattn": "0.0", "torch": "2.0"}
#: each benchmark script's renderer and the stem of its committed results
SCRIPTS = {"foundation_speed": "foundation", "learned_speed": "learned",
           "lm_speed_report": "lm", "nystrom_speed": "nystrom", "pinv_init": "pinv-init",
           "rpe_blocked_speed": "rpe-blocked", "rpe_speed": "rpe"}  # fmt: skip


def speed_rows() -> tuple[SpeedConfig, list[SpeedRow]]:
    config = SpeedConfig(mechanisms=("performer", "gaussian", "skyformer"), lengths=(256, 1024))
    rows = []
    for length, scale in ((256, 1.0), (1024, 4.0)):
        rows += [
            SpeedRow("softmax", length, time_ms=scale, peak_memory_mib=scale, speedup=1.0,
                     memory_ratio=1.0, check_error=1e-7, checked_at=length),
            SpeedRow("performer", length, time_ms=2.0, peak_memory_mib=3.0, speedup=scale / 2,
                     memory_ratio=3.0 / scale, check_error=1e-6, checked_at=length),
            SpeedRow("skyformer", length, status="error: out of memory"),
        ]  # fmt: skip
    rows.append(SpeedRow("gaussian", 256, time_ms=2.0, peak_memory_mib=2.0, speedup=0.5))
    rows.append(SpeedRow("gaussian", 1024, status="skipped: predicted 9 s per call > 2 s"))
    return config, rows


def test_speed_tables_render():
    config, rows = speed_rows()
    text = speed_markdown(config, rows, INFO)
    assert check_tables(text) == 2
    assert "| performer | 2 (0.5×) | 2 (2×) | ≈ 512 |" in text


def test_study_tables_render():
    sweep = [SweepRow(v, r, m, 0.1 * r, 0.01, 2) for v in ("prf", "nprf") for r in (1.0, 2.0)
             for m in (4, 16)]  # fmt: skip
    kernel = [KernelRow(v, v, "exp", m, 0.1 / m, 0.01, 1 / m, 0.01, 2)
              for v in ("prf", "trf") for m in (16, 64, 256)]  # fmt: skip
    mechanisms = [MechanismRow(name, "softmax", name == "performer", causal, n, 0.1, 0.01, 4)
                  for name in ("performer", "linformer") for n in (256, 1024)
                  for causal in (False, True) if not (causal and name == "linformer")]  # fmt: skip
    spectral = [SpectralRow(name, "softmax", n, m, 0.2, 0.01, 4)
                for name in ("performer", "skyformer")
                for n in (128, 256) for m in (16, 64)]  # fmt: skip
    stability = [StepScore(name, seed, step, 1.0, 0.9) for name in ("gaussian", "skyformer")
                 for seed in (0, 1) for step in (1, 2)]  # fmt: skip
    written = {
        "norm-sweep": rows_to_markdown(sweep),
        "kernel": kernel_markdown(kernel),
        "mechanisms": mechanism_markdown(mechanisms),
        "spectral": spectral_markdown(spectral),
        "stability": stability_markdown(stability),
    }
    counts = {name: check_tables(text, name) for name, text in written.items()}
    assert counts == {"norm-sweep": 2, "kernel": 2, "mechanisms": 1, "spectral": 2,
                      "stability": 1}  # fmt: skip


def run_results(task: str, **extra):
    return {"task": task, "mechanism": "performer", "attention_options": {"num_features": 64},
            "steps": 10, "test_accuracy": 0.5, "best_valid_accuracy": 0.5,
            "majority_baseline": 0.2, "wall_time_s": 3.0, "steps_per_s": 3.3,
            "peak_memory_bytes": 2**28, "num_parameters": 1000, "device": "cpu",
            **extra}  # fmt: skip


def test_demo_and_report_tables_render(tmp_path):
    config, rows = speed_rows()
    summary = summary_table(rows, {"performer": (0.1, True)}, {"performer": run_results("x")})
    assert check_tables(summary, "demo summary") == 1
    runs = [(Path("a"), run_results("listops")), (Path("b"), run_results("text"))]
    assert check_tables(runs_table(runs), "runs") == 1
    lm = [(Path("c"), run_results("lm", test_bits_per_byte=2.0, tokens_per_s=100.0))]
    assert check_tables(lm_table(lm), "lm") == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(run_results("listops")))
    write_speed(tmp_path / "speed", config, rows, INFO)
    report = build_report([tmp_path], tmp_path / "report.md")
    assert check_tables(report, "report") == 3  # the runs, then speed's time and memory


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_scripts_render_their_committed_results(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    render = importlib.import_module(script).render
    sources = sorted(RESULTS.glob(f"{SCRIPTS[script]}-cpu-*.json"))  # one per machine
    assert sources
    for source in sources:
        text = render(json.loads(source.read_text()))
        assert check_tables(text, script) >= 1
        assert text == source.with_suffix(".md").read_text()  # the committed table is this one


#: the committed result tables (a folder's README.md says how its runs were made instead)
COMMITTED = sorted(p for p in RESULTS.rglob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_result_table_renders(path):
    assert check_tables(path.read_text(), str(path.relative_to(ROOT))) >= 1


@pytest.mark.parametrize("path", sorted(RESULTS.rglob("speed-*.json")),
                         ids=lambda p: str(p.relative_to(RESULTS)))  # fmt: skip
def test_committed_speed_tables_are_rendered_from_their_json(path):
    assert render_speed_report(json.loads(path.read_text()), path.with_suffix(".png")) == (
        path.with_suffix(".md").read_text()
    )


def test_speed_markdown_is_rendered_again_from_its_json(tmp_path):
    config, rows = speed_rows()
    js, md = (p for p in write_speed(tmp_path, config, rows, INFO) if p.suffix in (".md", ".json"))
    report = json.loads(js.read_text())
    assert render_speed_report(report, js.with_suffix(".png")) == md.read_text()


def test_reader_catches_a_missing_delimiter_cell():
    with pytest.raises(AssertionError, match="3 header cells, 2 delimiter cells"):
        check_tables("| a | b | c |\n|---|---|\n| 1 | 2 | 3 |\n")
    assert cells(r"| a \| b | c |") == [r"a \| b", "c"]
