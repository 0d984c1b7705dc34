"""``benchmarks/vit_speed.py`` runs end to end (``--quick``) and writes its tables; its pure
parts (sizes, ratios) compute what they say."""

import json

import pytest

from .test_benchmark_scripts import import_benchmark, run_quick


def _report_module():
    return import_benchmark("vit_speed_report")


def test_vit_speed_quick_run_writes_results(tmp_path):
    run_quick("vit_speed.py", tmp_path)
    (md,) = tmp_path.glob("vit-cpu-*-quick.md")
    (js,) = tmp_path.glob("vit-cpu-*-quick.json")
    report = json.loads(js.read_text())
    assert report["command"].startswith("python benchmarks/vit_speed.py --quick")
    config = report["config"]
    assert (config["dim"], config["heads"], config["ffn_dim"], config["batch"]) == (384, 6, 1536, 2)
    assert config["configs"]["nprf_rpe"]["rpe"] == "toeplitz2d"
    assert config["configs"]["nprf_rpe"]["num_features"] == 32
    assert config["configs"]["nprf_rpe fft"]["rpe_method"] == "fft"
    assert set(report["machine"]) >= {"processor", "torch", "kattn", "torch_threads"}
    rows = report["rows"]
    assert [(r["image"], r["patch"], r["grid"], r["length"]) for r in rows] == [
        (32, 4, [8, 8], 64),
        (16, 1, [16, 16], 256),
    ]
    for row in rows:
        assert set(row["seconds"]) == {"softmax", "nprf_rpe", "nprf_rpe fft"}
        assert all(t > 0 for t in row["seconds"].values())
        assert all(len(t) == 1 for t in row["round_seconds"].values())
        assert all(m > 0 for m in row["memory_bytes"].values())
        soft, kern = row["seconds"]["softmax"], row["seconds"]["nprf_rpe"]
        assert row["time_ratio"]["value"] == pytest.approx(soft / kern)
        fft = row["seconds"]["nprf_rpe fft"]
        assert row["fft_time_ratio"]["value"] == pytest.approx(soft / fft)
        mem = row["memory_bytes"]
        assert row["memory_ratio"] == pytest.approx(mem["softmax"] / mem["nprf_rpe"])
        assert max(row["correctness_max_abs_error"].values()) < 1e-4
        assert row["kernelized_path"] in ("blocked (exact)", "fft")
    assert any("Luo et al. 2021" in note for note in report["notes"])
    text = md.read_text()
    assert "| 32 | 4 | 8×8 | 64 |" in text and "| 16 | 1 | 16×16 | 256 |" in text
    assert "## Notes" in text and "`--quick` smoke run" in text


def test_sizes_are_image_by_patch_pairs_that_tile():
    report = _report_module()
    assert report.parse_sizes("64x4,224x4, 64x1") == [(64, 4), (224, 4), (64, 1)]
    with pytest.raises(ValueError, match="IMAGExPATCH"):
        report.parse_sizes("64")
    with pytest.raises(ValueError, match="patch side must divide"):
        report.parse_sizes("30x4")


def test_time_ratio_is_softmax_over_nprf_rpe_of_medians_and_per_round():
    report = _report_module()
    summary = report.ratio_summary({"softmax": [2.0, 4.0, 3.0], "nprf_rpe": [1.0, 1.0, 2.0]})
    assert summary == {"value": 3.0, "rounds": [2.0, 4.0, 1.5]}


def test_a_size_above_the_fft_cap_renders_without_the_fft_row():
    report = _report_module()
    row = {
        "image": 64, "patch": 1, "grid": [64, 64], "length": 4096,
        "seconds": {"softmax": 2.0, "nprf_rpe": 1.0},
        "memory_bytes": {"softmax": 2**30, "nprf_rpe": 2**29},
        "time_ratio": {"value": 2.0, "rounds": [1.9, 2.1]}, "fft_time_ratio": None,
        "memory_ratio": 2.0, "kernelized_path": "blocked (exact)",
    }  # fmt: skip
    result = {
        "machine": {"processor": "cpu", "torch_threads": 2, "torch": "2", "kattn": "0"},
        "config": {"dim": 384, "heads": 6, "ffn_dim": 1536, "batch": 8, "dtype": "float32",
                   "rounds": "3"},
        "command": "python benchmarks/vit_speed.py", "rows": [row], "notes": [],
    }  # fmt: skip
    line = next(x for x in report.render(result).splitlines() if x.startswith("| 64 | 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[7:9] == ["—", "—"] and cells[11] == "—"  # FFT time, ratio and peak
    assert cells[6].startswith("2.00×")
