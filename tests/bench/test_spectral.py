"""The spectral-norm approximation study (Chen et al. 2021, Skyformer, §4.5, Fig. 1)."""

import pytest
import torch

from kattn.bench.spectral import relative_spectral_error, spectral_study
from kattn.cli import main


def test_relative_spectral_error_is_the_largest_singular_value_ratio():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 3, 20, 5, generator=g)
    assert relative_spectral_error(y, y).abs().max() == 0
    torch.testing.assert_close(
        relative_spectral_error(1.5 * y, y), torch.full((2, 3), 0.5, dtype=torch.float64)
    )
    noise = torch.randn(20, 5, generator=g)
    expected = torch.linalg.svdvals(noise.double())[0] / torch.linalg.svdvals(y[0, 0].double())[0]
    torch.testing.assert_close(relative_spectral_error(y[0, 0] + noise, y[0, 0]), expected)


@pytest.fixture(scope="module")
def rows():
    return spectral_study(lengths=(128,), features=(8, 32, 128), heads=2, seeds=2)


def test_skyformer_error_falls_clearly_with_landmarks(rows):
    sky = {r.features: r.rel_error for r in rows if r.mechanism == "skyformer"}
    assert sky[8] > sky[32] > sky[128]
    assert sky[128] < 0.3 * sky[8]


def test_every_pair_is_measured_against_its_exact_reference(rows):
    pairs = {(r.mechanism, r.reference) for r in rows}
    assert pairs == {
        ("skyformer", "gaussian"),
        ("nystromformer", "softmax"),
        ("performer", "softmax"),
        ("linformer", "softmax"),
    }
    assert all(r.samples == 4 and r.rel_error >= 0 for r in rows)
    ny = {r.features: r.rel_error for r in rows if r.mechanism == "nystromformer"}
    assert ny[128] < 1e-5 < ny[8]  # m >= L: every landmark is one token, exact softmax


def test_cli_spectral_writes_csv_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "spectral"
    args = ["bench", "approx", "--experiment", "spectral", "--quick", "--heads", "1"]
    assert main([*args, "--mechanisms", "skyformer,linformer", "--out", str(out)]) == 0
    for suffix in ("csv", "md", "png"):
        assert (out / f"spectral.{suffix}").stat().st_size > 0
    text = (out / "spectral.md").read_text()
    assert "skyformer (vs gaussian)" in text and "nystromformer" not in text
    assert "L = 256" in capsys.readouterr().out
    assert main([*args, "--mechanisms", "bigbird", "--out", str(out)]) == 2
    with pytest.raises(SystemExit) as exit_info:  # not silently the default
        main([*args, "--seeds", "0", "--out", str(out)])
    assert exit_info.value.code == 2
