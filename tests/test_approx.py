"""The norm-sweep approximation study (seed 000 Fig. 1b) and ``kattn bench approx``."""

import csv

import pytest

from kattn.bench.approx import norm_sweep, rows_to_markdown
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
