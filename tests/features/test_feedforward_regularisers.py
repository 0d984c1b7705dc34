"""Feed-forward kernels' regularisers (Yorsh 2022, §4.1): the orthogonality
regulariser and the (variational) autoencoder losses."""

import pytest
import torch
import torch.nn.functional as F

import kattn
from kattn.features.feedforward import orthogonality_defect

from ..helpers import assert_close, qkv
from .feedforward_helpers import (
    NAMES,
    D,
    H,
    build_attention,
    build_map,
    project,
    softplus,
    two_layers,
)

# ------------------------------------------------------------------------- regulariser
PENALISED = {
    "ffk_linear": ["weight"],
    "ffk_fcnn": ["hidden.0", "hidden.1", "weight"],
    "ffk_glu": ["layers.0.transform", "layers.1.transform"],
    "ffk_oglu": ["layers.0.transform", "layers.1.transform"],
    "ffk_aoglu": ["layers.0.transform", "layers.1.transform"],
    "ffk_ae": ["encoder"],
    "ffk_vae": ["mean"],
}


@pytest.mark.parametrize("num_features", [8, 16, 24], ids=["M<D", "M=D", "M>D"])
@pytest.mark.parametrize("name", NAMES)
def test_penalty_is_zero_at_orthogonal_init(name, num_features):
    fm = build_map(
        name, num_features=num_features, orthogonal_penalty=1.0, **two_layers(name)
    ).eval()
    assert fm.regularization_loss() < 1e-10
    for pname, p in fm.named_parameters():  # every weight matrix is orthogonal per head
        assert orthogonality_defect(p) < 1e-10, pname


def hand_defect(w):
    """``Σ_h ‖G_h − I‖_F²``, G the Gram matrix of the smaller side of ``w[h]``."""
    total = 0.0
    for m in w:
        gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
        total += (gram - torch.eye(gram.shape[0], dtype=m.dtype)).square().sum().item()
    return total


@pytest.mark.parametrize("name", NAMES)
def test_penalty_covers_exactly_the_transform_matrices(name):
    fm = build_map(name, orthogonal_penalty=0.5, **two_layers(name)).eval()
    params = dict(fm.named_parameters())
    for pname, p in params.items():
        with torch.no_grad():
            saved = p.clone()
            p.mul_(1.1)
        expected = 0.5 * hand_defect(p.detach())
        assert abs(expected - 0.5 * H * min(p.shape[1:]) * (1.1**2 - 1) ** 2) < 1e-4
        loss = fm.regularization_loss()
        if pname in PENALISED[name]:
            assert abs(loss.item() - expected) < 1e-9 * expected, pname
        else:
            assert loss < 1e-10, pname
        with torch.no_grad():
            p.copy_(saved)
    assert set(PENALISED[name]) <= set(params)


@pytest.mark.parametrize(("rows", "cols"), [(16, 6), (6, 16)], ids=["tall", "wide"])
def test_penalty_of_a_hand_set_weight(rows, cols):
    """Orthogonal W of either shape costs 0; a perturbed one costs λ Σ_h ‖G − I‖_F², linear in
    λ; λ = 0 costs 0."""
    g = torch.Generator().manual_seed(0)
    q_factor = torch.linalg.qr(torch.randn(H, max(rows, cols), min(rows, cols), generator=g))[0]
    orthogonal = (q_factor if rows >= cols else q_factor.transpose(-1, -2)).double()
    noise = 0.1 * torch.randn(H, rows, cols, generator=g, dtype=torch.float64)
    penalties = {}
    for lam in (0.0, 0.1, 0.3):
        fm = kattn.features.build(
            "ffk_linear", head_dim=rows, num_heads=H, num_features=cols, orthogonal_penalty=lam
        ).double()
        with torch.no_grad():
            fm.weight.copy_(orthogonal)
        assert fm.regularization_loss() < 1e-10
        with torch.no_grad():
            fm.weight.add_(noise)
        penalties[lam] = fm.regularization_loss().item()
    w = orthogonal + noise
    small = min(rows, cols)
    gram = w @ w.transpose(-1, -2) if rows <= cols else w.transpose(-1, -2) @ w
    assert gram.shape == (H, small, small)
    expected = sum(torch.linalg.matrix_norm(gram[h] - torch.eye(small)) ** 2 for h in range(H))
    assert penalties[0.0] == 0.0
    assert penalties[0.1] > 1e-3
    assert abs(penalties[0.1] - 0.1 * expected.item()) < 1e-9
    assert abs(penalties[0.3] - 3 * penalties[0.1]) < 1e-9


def test_regularization_loss_of_the_attention_is_the_maps():
    attn = build_attention("ffk_oglu")
    with torch.no_grad():
        attn.feature_map.layers[0].transform.mul_(2.0)
    loss = attn.regularization_loss()
    assert loss > 0 and loss.item() == attn.feature_map.regularization_loss().item()


# ------------------------------------------------------------------------ autoencoders
def test_autoencoder_records_its_reconstruction_loss_in_training_only():
    attn = build_attention("ffk_ae", train=True, reconstruction_weight=0.5)
    fm = attn.feature_map
    q, k, v = qkv(h=H, d=D, lq=9)

    def error(x):
        x_hat = project(softplus(project(x, fm.encoder)), fm.decoder)
        return (x_hat - x).square().sum(-1).mean()

    attn(q, k, v)
    expected = 0.5 * (error(q) + error(k)) / 2  # one record per call: keys and queries
    assert_close(attn.regularization_loss(), expected)
    assert attn.regularization_loss() > 0.1
    q2, k2, v2 = qkv(h=H, d=D, lq=9, seed=7)
    attn(q2, k2, v2)  # the next training forward releases the first records
    assert_close(attn.regularization_loss(), 0.5 * (error(q2) + error(k2)) / 2)
    attn.regularization_loss().backward()
    assert fm.decoder.grad is not None and fm.decoder.grad.abs().sum() > 0
    fm.training_step()
    assert attn.regularization_loss() == 0
    attn.eval()
    attn(q, k, v)
    assert attn.regularization_loss() == 0  # eval records nothing


def test_variational_loss_formula_and_sampling():
    fm = build_map("ffk_vae", reconstruction_weight=0.7, kl_weight=0.2).train()
    x = torch.randn(2, H, 6, D, dtype=torch.float64)
    torch.manual_seed(5)
    values = fm.features(x)
    torch.manual_seed(5)
    mean, log_var = project(x, fm.mean), project(x, fm.log_variance)
    z = mean + torch.exp(0.5 * log_var) * torch.randn(mean.shape, dtype=mean.dtype)
    assert_close(values, softplus(z))
    reconstruction = (project(z, fm.decoder) - x).square().sum(-1).mean()
    kl = (0.5 * (mean.square() + log_var.exp() - log_var - 1)).sum(-1).mean()
    assert_close(fm.regularization_loss(), 0.7 * reconstruction + 0.2 * kl)
    fm.regularization_loss().backward()
    for p in (fm.mean, fm.log_variance, fm.decoder):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert not torch.equal(fm.features(x), fm.features(x))  # training samples
    fm.eval()
    fm.training_step()
    assert torch.equal(fm.features(x), fm.features(x))  # eval is deterministic: z = μ
    assert_close(fm.features(x), softplus(mean))
    assert fm.regularization_loss() == 0


def test_vae_attention_eval_is_deterministic_and_training_is_not():
    attn = build_attention("ffk_vae")
    q, k, v = qkv(h=H, d=D, lq=10)
    torch.manual_seed(1)
    first = attn(q, k, v)
    torch.manual_seed(2)
    assert torch.equal(first, attn(q, k, v))
    attn.train()
    assert not torch.allclose(attn(q, k, v), attn(q, k, v))


def test_tiny_vae_model_trains_with_finite_loss():
    """The thesis's VAE kernel fails on accuracy; here it only has to train without NaNs."""
    torch.manual_seed(0)
    attn = kattn.build("kernelized", feature_map="ffk_vae", head_dim=8, num_heads=2).train()
    x = torch.randn(4, 2, 12, 8)
    target = torch.randn(4, 2, 12, 8)
    before = [p.detach().clone() for p in attn.parameters()]
    optimiser = torch.optim.Adam(attn.parameters(), lr=1e-2)
    for _ in range(5):
        optimiser.zero_grad()
        out = attn(x, x, x, causal=True)
        regularizer = attn.regularization_loss()
        loss = F.mse_loss(out, target) + regularizer
        assert torch.isfinite(loss) and regularizer > 0
        loss.backward()
        optimiser.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, attn.parameters(), strict=True))


def test_checkpoint_recomputation_keeps_the_record():
    from torch.utils.checkpoint import checkpoint

    attn = build_attention("ffk_ae", train=True)
    q, k, v = qkv(h=H, d=D, lq=9, requires_grad=True)
    out = checkpoint(attn, q, k, v, use_reentrant=False)
    records = list(attn.feature_map._recorded)
    assert len(records) == 2 and attn.regularization_loss() > 0  # keys and queries
    out.sum().backward()  # re-runs the forward inside backward: no new record, none released
    assert len(attn.feature_map._recorded) == 2
    assert all(a is b for a, b in zip(records, attn.feature_map._recorded, strict=True))
