"""``kattn report``: training runs and benchmark outputs found, tabled and linked."""

from __future__ import annotations

import json

import pytest

from kattn.bench.report import build_report, collect
from kattn.cli import main


def make_run(folder, mechanism, accuracy, curve=((10, 0.3), (20, 0.4))):
    folder.mkdir(parents=True)
    results = {"task": "listops", "mechanism": mechanism, "attention_options": {"num_features": 8},
               "steps": 20, "test_accuracy": accuracy, "best_valid_accuracy": 0.41,
               "majority_baseline": 0.16, "wall_time_s": 12.5, "steps_per_s": 3.0,
               "peak_memory_bytes": 3 << 20, "num_parameters": 1234, "device": "cpu"}  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))
    lines = [{"step": s, "split": "valid", "accuracy": a} for s, a in curve]
    lines.append({"step": 20, "split": "train", "loss": 1.0})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def make_benchmark(folder, stem="speed-x"):
    folder.mkdir(parents=True)
    (folder / f"{stem}.json").write_text(json.dumps({"benchmark": "speed", "rows": []}))
    (folder / f"{stem}.md").write_text(f"# Speed\n\n| a |\n|---|\n| 1 |\n\n![plot]({stem}.png)\n")
    (folder / f"{stem}.png").write_bytes(b"\x89PNG")
    (folder / "unrelated.json").write_text(json.dumps({"something": 1}))


def test_runs_and_benchmarks_are_found_below_the_paths(tmp_path):
    make_run(tmp_path / "runs" / "a", "softmax", 0.42)
    make_run(tmp_path / "runs" / "nested" / "b", "performer", 0.40)
    make_benchmark(tmp_path / "bench")
    found = collect([tmp_path / "runs", tmp_path / "bench", tmp_path / "bench"])
    assert sorted(f.name for f, _ in found.runs) == ["a", "b"]
    assert [p.name for p, _ in found.benchmarks] == ["speed-x.json"]


def test_report_tables_runs_best_first_and_relinks_plots(tmp_path):
    make_run(tmp_path / "runs" / "a", "performer", 0.40)
    make_run(tmp_path / "runs" / "b", "softmax", 0.42)
    make_benchmark(tmp_path / "bench")
    out = tmp_path / "out" / "report.md"
    text = build_report([tmp_path / "runs", tmp_path / "bench"], out)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `b` | listops | `softmax` (num_features=8)")
    assert "**42.0%**" in rows[0] and "16.0%" in rows[0] and "3 MiB" in rows[0]
    assert "## Speed" in text  # the benchmark's own title, one level down
    assert "![plot](../bench/speed-x.png)" in text
    assert (tmp_path / "out" / "report-training.png").exists()
    assert "![validation accuracy against step](report-training.png)" in text


def test_nothing_to_report_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="nothing to report"):
        build_report([tmp_path / "empty"], tmp_path / "r.md")
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_writes_the_report(tmp_path, capsys):
    make_run(tmp_path / "run", "softmax", 0.5)
    out = tmp_path / "r" / "report.md"
    assert main(["report", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert out.read_text().startswith("# kattn report")
    assert "written:" in capsys.readouterr().out


def test_language_model_runs_get_their_own_table(tmp_path):
    make_run(tmp_path / "runs" / "cls", "softmax", 0.42)
    for name, mechanism, bpb in (("lm-a", "performer", 2.9), ("lm-b", "softmax", 2.5)):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        results = {"task": "lm", "mechanism": mechanism, "steps": 100, "test_accuracy": 0.4,
                   "test_bits_per_byte": bpb, "best_valid_bits_per_byte": bpb + 0.1,
                   "unigram_bits_per_byte": 4.52, "test_perplexity": 5.7, "wall_time_s": 60,
                   "tokens_per_s": 4000.0, "peak_memory_bytes": 1 << 20}  # fmt: skip
        (folder / "results.json").write_text(json.dumps(results))
    text = build_report([tmp_path / "runs"], tmp_path / "report.md")
    lm = text.split("## Language-model runs")[1].split("## Training runs")[0]
    rows = [line for line in lm.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `lm-b`", "| `lm-a`"]
    assert "**2.500**" in rows[0] and "4.520" in rows[0] and "4,000" in rows[0]
    classification = text.split("## Training runs")[1]
    assert "`cls`" in classification and "lm-a" not in classification
