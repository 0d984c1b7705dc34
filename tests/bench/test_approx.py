"""The norm-sweep approximation study (Luo et al. 2021, §3.3, Fig. 1b) and
``kattn bench approx``."""

import csv
import json

import pytest
import torch

from kattn.bench.approx import (
    NORM_SWEEP_VARIANTS,
    SAMPLINGS,
    norm_sweep,
    rows_to_markdown,
    study_feature_map,
)
from kattn.cli import main


def table(rows, variant):
    return {(r.radius, r.features): r.l1_error for r in rows if r.variant == variant}


@pytest.fixture(scope="module")
def sweep():
    return norm_sweep(radii=(1, 3, 5), features=(4, 64, 1024), keys=256, seeds=3)


def test_prf_error_grows_with_the_norm_and_falls_with_features(sweep):
    err = table(sweep, "prf")
    assert err[1.0, 4] > err[1.0, 64] > err[1.0, 1024]
    for m in (4, 64, 1024):
        assert err[1.0, m] < err[3.0, m] < err[5.0, m]
    assert err[1.0, 1024] < 0.1 < 1.0 < err[5.0, 1024]  # R = 5 stays bad even with M = 1024


def test_normalised_queries_and_keys_do_not_depend_on_the_norm(sweep):
    err = table(sweep, "nprf")
    for m in (4, 64, 1024):
        assert err[1.0, m] == pytest.approx(err[5.0, m])
    assert err[1.0, 4] > err[1.0, 1024]


def test_trf_is_reported_too(sweep):
    err = table(sweep, "trf")
    assert err[1.0, 4] > err[1.0, 1024] and err[5.0, 64] > err[1.0, 64]
    assert "**trf**" in rows_to_markdown(sweep)


def test_cli_writes_csv_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "approx"
    assert main(["bench", "approx", "--experiment", "norm-sweep", "--quick",
                 "--variants", "prf,nprf", "--keys", "128", "--out", str(out)]) == 0  # fmt: skip
    rows = list(csv.DictReader((out / "norm-sweep.csv").open()))
    assert {r["variant"] for r in rows} == {"prf", "nprf"} and len(rows) == 2 * 3 * 4
    assert (out / "norm-sweep.png").stat().st_size > 1000
    assert "| R | M=4 |" in (out / "norm-sweep.md").read_text()
    assert "written to" in capsys.readouterr().out
    assert main(["bench", "approx", "--variants", "rks", "--out", str(out)]) == 2


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_the_sweep_draws_w_as_asked(sampling):
    w = study_feature_map("prf", dim=16, num_features=16, seed=0, sampling=sampling).projection
    gram = w.double() @ w.double().T
    off_diagonal = (gram - torch.diag(torch.diagonal(gram))).abs().max()
    # one block of D orthogonal rows: their Gram matrix is diagonal; iid rows are not
    assert (off_diagonal < 1e-3) == (sampling == "orthogonal")
    norms = w.double().norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, 4.0)) == (sampling == "sphere")


def test_the_sweep_defaults_to_iid_gaussian_rows_as_in_the_paper():
    small = {"radii": (1,), "features": (16,), "dim": 16, "keys": 64, "seeds": 2,
             "variants": NORM_SWEEP_VARIANTS[:1]}  # fmt: skip
    default = norm_sweep(**small)
    assert default == norm_sweep(**small, sampling="iid") and default[0].sampling == "iid"
    assert default[0].l1_error != norm_sweep(**small, sampling="orthogonal")[0].l1_error
    with pytest.raises(ValueError, match="sampling must be one of iid, orthogonal, sphere"):
        norm_sweep(**small, sampling="gaussian")


def test_cli_sampling_is_an_option_of_the_norm_sweep_and_recorded(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["bench", "approx", "--quick", "--variants", "prf", "--keys", "64", "--features",
            "4,16", "--radii", "1", "--out", str(out)]  # fmt: skip
    assert main([*argv, "--sampling", "orthogonal"]) == 0
    rows = json.loads((out / "norm-sweep.json").read_text())["rows"]
    assert {r["sampling"] for r in rows} == {"orthogonal"}
    assert "orthogonal rows" in (out / "norm-sweep.md").read_text()
    assert main(argv) == 0
    assert {r["sampling"] for r in csv.DictReader((out / "norm-sweep.csv").open())} == {"iid"}
    assert "i.i.d. N(0, I) rows" in (out / "norm-sweep.md").read_text()
    kernel = ["bench", "approx", "--experiment", "kernel", "--sampling", "iid"]
    assert main([*kernel, "--out", str(tmp_path / "k")]) == 2
    assert "--sampling applies to --experiment norm-sweep" in capsys.readouterr().err
