"""``kattn bench approx --experiment kernel|mechanisms``: random features against their exact
kernels, approximate mechanisms against their exact counterparts."""

import csv
import dataclasses
import json
import math

import pytest
import torch

import kattn
from kattn.bench.kernel_error import (
    KERNEL_VARIANTS,
    build_variant,
    estimate,
    kernel_study,
    loglog_slope,
    softmax_kernel,
)
from kattn.bench.mechanism_error import (
    EXACT_REFERENCES,
    approximate_mechanisms,
    mechanism_study,
)
from kattn.cli import main
from kattn.registry import MECHANISMS

FEATURES = (16, 64, 256, 1024)


@pytest.fixture(scope="module")
def kernel_rows():
    # small inputs keep the PRF estimator's variance (∝ exp(‖x + y‖²)) moderate: every seed
    # then shows the 1/M law rather than the heavy tail of one draw
    return kernel_study(features=FEATURES, dim=16, keys=32, seeds=4, input_std=0.3)


@pytest.mark.parametrize("variant", [v.label for v in KERNEL_VARIANTS])
def test_kernel_error_falls_like_one_over_m(kernel_rows, variant):
    rel = {r.features: r.rel_mse for r in kernel_rows if r.variant == variant}
    # 64 times the features: an unbiased estimator's MSE falls 64-fold, a biased one floors
    assert rel[1024] < rel[16] / 16
    assert all(rel[m] * m < 2.0 for m in FEATURES)  # relative variance of one feature < 2
    slope = loglog_slope(list(FEATURES), [rel[m] for m in FEATURES])
    assert slope < -0.7  # orthogonal draws may fall faster than 1/M, never slower


def test_a_wrong_exact_kernel_shows_as_a_floor():
    # gmm_prf's random means make its kernel differ from exp(x·y): against that, the error
    # stops falling, which is what the test above would catch
    wrong = dataclasses.replace(KERNEL_VARIANTS[4], label="gmm_prf vs exp", exact=softmax_kernel)
    assert wrong.feature_map == "gmm_prf"
    rows = kernel_study(features=(16, 1024), dim=16, keys=32, seeds=4, input_std=0.3,
                        variants=(wrong,))  # fmt: skip
    assert rows[1].rel_mse * 1024 > 4.0


def test_estimate_applies_log_scales_like_the_dense_features():
    fm = build_variant(KERNEL_VARIANTS[0], 32, dim=8, seed=0)
    x = torch.randn(5, 8, dtype=torch.float64)
    dense = fm.features(x[None, None], 0.5)[0, 0]
    torch.testing.assert_close(estimate(fm, x, x, 0.5), dense @ dense.T)


def test_rks_variants_count_cos_and_sin_features():
    by_label = {v.label: v for v in KERNEL_VARIANTS}
    assert build_variant(by_label["gmm_rks"], 64, dim=16, seed=0).num_features == 64
    with pytest.raises(ValueError, match="multiple of 2"):
        build_variant(by_label["fastfood_rks"], 33, dim=16, seed=0)


def test_every_declared_counterpart_is_an_exact_reference():
    declared = {name: kattn.spec(name).approximates for name in kattn.available()}
    assert {r for r in declared.values() if r is not None} <= set(EXACT_REFERENCES)
    exact = [name for name in kattn.available() if kattn.spec(name).is_exact]
    assert declared["softmax"] is None and declared["local"] == declared["bigbird"] == "softmax"
    # exact mechanisms name a counterpart only when they are exact over a restricted pattern
    assert all(declared[n] is None or hasattr(MECHANISMS.get(n).cls, "pattern") for n in exact)
    assert declared["skyformer"] == "gaussian" and declared["performer"] == "softmax"
    assert declared["nprf_rpe"] == "softmax_unit_qk" and declared["linear"] is None
    assert set(approximate_mechanisms()) >= {n for n, r in declared.items() if r is not None}


def test_mechanism_study_rows():
    names = ["performer", "skyformer", "nystromformer", "linear", "nprf_rpe"]
    rows = mechanism_study(names, lengths=(160,), head_dim=16, heads=2, seeds=1)
    by_key = {(r.mechanism, r.causal): r for r in rows}
    # a non-causal row for each, a causal one where supported
    assert {m for m, _ in by_key} == set(names)
    assert ("skyformer", True) not in by_key and ("performer", True) in by_key
    assert all(math.isfinite(r.rel_error) and r.rel_error > 0 for r in rows)
    assert by_key["skyformer", False].reference == "gaussian"
    assert by_key["performer", False].reference == "softmax"
    assert by_key["nprf_rpe", False].reference == "softmax_unit_qk"
    assert not by_key["linear", False].counterpart and by_key["skyformer", False].counterpart
    assert all(r.samples == 2 for r in rows)


def test_mechanism_study_defaults_to_every_approximate_mechanism():
    rows = mechanism_study(lengths=(32,), head_dim=8, heads=1, seeds=1)
    names = {r.mechanism for r in rows}
    specs = {n: kattn.spec(n) for n in kattn.available()}
    assert names == {n for n, s in specs.items() if not s.is_exact or s.approximates}
    assert "softmax" not in names and "gaussian" not in names
    # the exact-over-a-pattern baselines stand in for softmax: their error is what they leave out
    assert {"local", "longformer", "bigbird", "sparse_transformer"} <= names


def _check_outputs(out, stem, column):
    rows = list(csv.DictReader((out / f"{stem}.csv").open()))
    report = json.loads((out / f"{stem}.json").read_text())
    assert report["benchmark"] == stem and report["machine"]["torch"] == torch.__version__
    assert len(report["rows"]) == len(rows) > 0 and column in report["rows"][0]
    assert report["caption"] in (out / f"{stem}.md").read_text()
    assert (out / f"{stem}.png").stat().st_size > 10_000
    return rows


def test_cli_kernel_writes_csv_json_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "kernel"
    argv = ["bench", "approx", "--experiment", "kernel", "--quick", "--out", str(out)]
    assert main(argv) == 0
    rows = _check_outputs(out, "kernel", "rel_mse")
    assert {r["variant"] for r in rows} == {v.label for v in KERNEL_VARIANTS}
    assert "| prf-iid |" in capsys.readouterr().out
    assert main([*argv[:-2], "--variants", "nprf", "--out", str(out)]) == 2  # a norm-sweep one


def test_cli_mechanisms_writes_csv_json_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "mechanisms"
    argv = ["bench", "approx", "--experiment", "mechanisms", "--quick", "--dim", "16"]
    assert main([*argv, "--mechanisms", "performer,skyformer", "--out", str(out)]) == 0
    rows = _check_outputs(out, "mechanisms", "rel_error")
    assert {(r["mechanism"], r["reference"]) for r in rows} == {
        ("performer", "softmax"),
        ("skyformer", "gaussian"),
    }
    assert "| skyformer | gaussian |" in capsys.readouterr().out


def test_cli_rejects_unknown_exact_and_misplaced_options(tmp_path, capsys):
    argv = ["bench", "approx", "--experiment", "mechanisms", "--quick", "--out", str(tmp_path)]
    assert main([*argv, "--mechanisms", "no_such_mechanism"]) == 2
    assert "no_such_mechanism" in capsys.readouterr().err
    assert main([*argv, "--mechanisms", "softmax"]) == 2  # exact: a reference, not a subject
    assert main([*argv, "--radii", "1,2"]) == 2  # a norm-sweep option, not silently ignored
    assert "applies to --experiment norm-sweep" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # refused while parsing
        main([*argv, "--input-std", "0"])
    assert exit_info.value.code == 2 and "argument --input-std" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_pattern_baselines_err_by_what_their_pattern_leaves_out():
    # local's default window (128 back, 127 ahead; causal 255 back) covers L = 100 whole:
    # softmax to rounding; bigbird's blocks (64) at L = 1024 leave most keys out
    rows = mechanism_study(["local", "bigbird"], lengths=(100, 1024), head_dim=8, heads=1, seeds=1)
    err = {(r.mechanism, r.causal, r.length): r.rel_error for r in rows}
    assert all(r.reference == "softmax" and r.counterpart for r in rows)
    assert err["local", False, 100] < 1e-5 and err["local", True, 100] < 1e-5
    assert err["bigbird", False, 1024] > 1e-3 and err["local", False, 1024] > 1e-3
