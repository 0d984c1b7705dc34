"""The small encoder of kattn.nn and the instability score (Chen et al. 2021, Skyformer,
Appendix F)."""

import math

import pytest
import torch

from kattn.bench.stability import (
    build_model,
    instability_scores,
    stability_study,
    summary,
    synthetic_batches,
)
from kattn.cli import main
from kattn.nn import SequenceClassifier, TransformerEncoder, sinusoidal_positions


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_encoder_ignores_padded_tokens(norm_first, positions):
    torch.manual_seed(0)
    enc = TransformerEncoder(20, 16, dim=16, num_heads=2, ffn_dim=32, positions=positions,
                             norm_first=norm_first).eval()  # fmt: skip
    tokens = torch.randint(1, 20, (2, 16))
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[1, 10:] = True
    garbage = tokens.clone()
    garbage[1, 10:] = 7
    out, out2 = enc(tokens, mask), enc(garbage, mask)
    assert out.shape == (2, 16, 16)
    torch.testing.assert_close(out[1, :10], out2[1, :10])
    torch.testing.assert_close(out[0], out2[0])


def test_classifier_mean_pooling_counts_only_real_tokens():
    torch.manual_seed(0)
    model = SequenceClassifier(20, 12, 3, dim=16, num_heads=2, ffn_dim=32).eval()
    tokens = torch.randint(1, 20, (1, 12))
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[0, 8:] = True
    full = model(tokens[:, :8])  # the same 8 tokens, no padding at all
    torch.testing.assert_close(model(tokens, mask), full)
    with pytest.raises(ValueError, match="pooling"):
        SequenceClassifier(20, 12, 3, pooling="max")
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(1, 20, (1, 13)))


def test_sinusoidal_positions_are_vaswani():
    table = sinusoidal_positions(5, 6)
    assert table.shape == (5, 6)
    assert table[3, 0] == pytest.approx(math.sin(3.0))
    assert table[3, 1] == pytest.approx(math.cos(3.0))
    assert table[3, 2] == pytest.approx(math.sin(3.0 / 10000 ** (2 / 6)))


def test_instability_score_is_output_change_over_parameter_change():
    batches = synthetic_batches(3, batch=2, length=24, seed=0)
    model = build_model("softmax", seed=0, length=24, vocab=32, classes=10)
    taus = instability_scores(model, batches, lr=1e-3)
    assert len(taus) == 3 and all(t > 0 and math.isfinite(t) for t in taus)
    frozen = build_model("softmax", seed=0, length=24, vocab=32, classes=10)
    assert all(math.isnan(t) for t in instability_scores(frozen, batches, lr=0.0))


def test_models_start_from_the_same_weights():
    ref = build_model("softmax", seed=3, length=24, vocab=32, classes=10)
    other = build_model("linformer", seed=4, length=24, vocab=32, classes=10, reference=ref)
    mine, theirs = other.state_dict(), ref.state_dict()
    shared = [k for k in theirs if k in mine]
    assert "encoder.embedding.weight" in shared and len(shared) == len(theirs)
    for key in shared:
        torch.testing.assert_close(mine[key], theirs[key])


def test_ratios_to_softmax_are_per_step_and_nystromformer_tracks_softmax():
    rows = stability_study(["nystromformer", "gaussian"], steps=4, seeds=1, batch=4, length=160)
    assert [r.step for r in rows if r.mechanism == "gaussian"] == [1, 2, 3, 4]
    assert all(r.ratio == 1.0 for r in rows if r.mechanism == "softmax")
    assert all(r.tau > 0 and math.isfinite(r.ratio) for r in rows)
    table = summary(rows)
    assert table["softmax"] == (1.0, 0.0, 1)
    # Nyströmformer approximates softmax attention: its output responds to updates alike
    assert 0.7 < table["nystromformer"][0] < 1.4


def test_cli_stability_writes_csv_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "stability"
    args = ["bench", "stability", "--quick", "--length", "64", "--batch", "2", "--out", str(out)]
    assert main([*args, "--mechanisms", "skyformer"]) == 0
    for suffix in ("csv", "md", "png"):
        assert (out / f"stability.{suffix}").stat().st_size > 0
    assert "| skyformer |" in (out / "stability.md").read_text()
    assert "written to" in capsys.readouterr().out
    assert main([*args, "--mechanisms", "nonesuch"]) == 2
