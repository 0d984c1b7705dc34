"""``kattn study conversion | feature-dim | feature-map`` on a toy IWSLT folder with 1-layer
models and 4 steps: the runs, study.json (every number per seed), study.md (mean ± 95%
interval), resuming without training again, and refusals; the interval itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kattn.cli import main
from kattn.train.study_report import mean_ci, t_quantile_975

from ..train.test_train_translation import write_iwslt

TINY = [
    "--set", "model.dim=32", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
    "--set", "model.ffn_dim=64", "--set", "data.bpe_size=300", "--set", "data.max_tokens=256",
    "--set", "train.eval_every=2", "--set", "optim.warmup_steps=1", "--steps", "4",
    "--bleu-examples", "5", "--device", "cpu", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_iwslt(tmp_path_factory.mktemp("iwslt"), sizes=(200, 20, 20))


def study(name: str, iwslt: Path, out: Path, *argv: str) -> int:
    return main(["study", name, "--data", str(iwslt), "--out", str(out), *TINY, *argv])


def test_conversion_study_writes_every_seed_and_resumes(iwslt: Path, tmp_path: Path, capsys):
    out = tmp_path / "conversion"
    assert study("conversion", iwslt, out, "--seeds", "2", "--features", "8,16") == 0
    captured = capsys.readouterr()
    assert "| standard | " in captured.out and "run 8/8" in captured.err
    result = json.loads((out / "study.json").read_text())
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    variants = ("softmax", "softmax_rpe", "normalized_softmax", "normalized_softmax_rpe")
    assert runs == sorted(f"{v}-seed{s}" for v in variants for s in (42, 43))
    assert [c["key"] for c in result["columns"]] == ["oracle", "m8", "m16"]
    assert len(result["records"]) == 8 * 3
    converted = [r for r in result["records"] if r["row"] == "normalized_softmax_rpe"
                 and r["column"] == "m16"]  # fmt: skip
    assert {r["seed"] for r in converted} == {42, 43}
    assert converted[0]["targets"] == {"encoder": "nprf_rpe", "decoder": "nprf_rpe",
                                       "cross": "kernelized"}  # fmt: skip
    cell = result["summary"]["loss"]["normalized_softmax_rpe|m16"]
    mean, ci = mean_ci([r["loss"] for r in converted])
    assert cell["mean"] == pytest.approx(mean) and cell["ci95"] == pytest.approx(ci)
    assert cell["n"] == 2 and ci is not None and ci > 0
    table = (out / "study.md").read_text()
    assert "| trained attention | Oracle | M=8 | M=16 |" in table
    assert f"{mean:.3f} ± {ci:.3f}" in table
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/best.pt")}
    assert len(stamps) == 8
    # again: every run is done, nothing is trained, the study is written again
    assert study("conversion", iwslt, out, "--seeds", "2", "--features", "8,16") == 0
    err = capsys.readouterr().err
    assert err.count(": done") == 8 and ": trained" not in err
    assert err.count("scores reused") == 8  # and nothing is scored twice
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/best.pt")} == stamps
    assert json.loads((out / "study.json").read_text())["records"] == result["records"]
    # other scoring settings score again
    assert study("conversion", iwslt, out, "--seeds", "2", "--features", "8") == 0
    assert "scores reused" not in capsys.readouterr().err


def test_feature_dim_and_feature_map_studies(iwslt: Path, tmp_path: Path, capsys):
    dim = tmp_path / "dim"
    assert study("feature-dim", iwslt, dim, "--seeds", "1", "--features", "8,16") == 0
    result = json.loads((dim / "study.json").read_text())
    assert [r["label"] for r in result["rows"]] == ["M=8", "M=16"]
    config = json.loads((dim / "nprf_rpe-m16-seed42" / "config.json").read_text())["attention"]
    assert config == {**config, "name": "nprf_rpe", "options": {"num_features": 16}}
    assert result["summary"]["bleu"]["nprf_rpe-m8|trained"]["ci95"] is None  # one seed
    fmap = tmp_path / "map"
    argv = ("--seeds", "1", "--features", "8", "--decoder-features", "12",
            "--feature-maps", "trf,sphere-prf")  # fmt: skip
    assert study("feature-map", iwslt, fmap, *argv) == 0
    result = json.loads((fmap / "study.json").read_text())
    assert [r["label"] for r in result["rows"]] == ["TRF", "Sphere-PRF"]
    config = json.loads((fmap / "nprf_rpe-sphere-prf-seed42" / "config.json").read_text())
    attention = config["attention"]
    assert attention["options"] == {"feature_map": "prf", "sampling": "sphere", "num_features": 8}
    assert attention["decoder_options"] == attention["cross_options"] == {"num_features": 12}
    assert all(math.isfinite(r["loss"]) for r in result["records"])
    assert "| feature map | trained |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["conversion", "--set", "attention.name=softmax"], "the study chooses the mechanisms"),
        (["conversion", "--variants", "softmax,nope"], "unknown variants"),
        (["feature-map", "--features", "8,16"], "takes one M"),
        (["feature-map", "--feature-maps", "rff"], "unknown feature maps"),
    ],
)
def test_bad_studies_are_refused(iwslt: Path, tmp_path: Path, capsys, argv, message) -> None:
    assert study(argv[0], iwslt, tmp_path / "s", *argv[1:]) == 2
    assert message in capsys.readouterr().err


def test_a_changed_config_is_not_mixed_with_the_runs_there(iwslt: Path, tmp_path: Path, capsys):
    out = tmp_path / "dim"
    assert study("feature-dim", iwslt, out, "--seeds", "1", "--features", "8") == 0
    argv = ("--seeds", "1", "--features", "8", "--set", "optim.lr=0.01")
    assert study("feature-dim", iwslt, out, *argv) == 2
    assert "holds a run of another config" in capsys.readouterr().err


def test_the_interval_is_students() -> None:
    assert t_quantile_975(4) == pytest.approx(2.776, abs=1e-3)
    assert t_quantile_975(40) == pytest.approx(2.021, abs=1e-3)
    assert t_quantile_975(120) == pytest.approx(1.980, abs=1e-3)
    mean, ci = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and ci == pytest.approx(4.303 / math.sqrt(3))
    assert mean_ci([5.0]) == (5.0, None)
