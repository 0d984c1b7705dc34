"""Learned spectral feature maps (GMM, FastFood, Generative; RKS and PRF forms)."""

import math

import pytest
import torch

import kattn
from kattn.features import build as build_map
from kattn.functional import hadamard_matrix, linear_attention_reference

SPECTRAL = [
    "gmm_rks",
    "gmm_prf",
    "fastfood_rks",
    "fastfood_prf",
    "generative_rks",
    "generative_prf",
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------- kernel estimates
def pairs(d: int, seed: int = 3, std: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    return (
        torch.randn(1, 1, 24, d, generator=g) * std,
        torch.randn(1, 1, 24, d, generator=g) * std,
    )


def kernel_estimate(fm, x, y):
    return fm.features(x) @ fm.features(y).transpose(-1, -2)


def gaussian_gram(x, y, sigma2: float):
    return torch.exp(-0.5 * sigma2 * torch.cdist(x, y).square())


def gmm_rks(d, m, sigma, seed=1):
    fm = build_map(
        "gmm_rks", head_dim=d, num_heads=1, num_features=m, components=1, generator=gen(seed)
    )
    with torch.no_grad():
        fm.mean.zero_()
        fm.scale_matrix.copy_(sigma * torch.eye(d))
    return fm


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_gmm_rks_estimates_the_gaussian_kernel(sigma):
    x, y = pairs(16)
    exact = gaussian_gram(x, y, sigma**2)  # exp(−σ²‖x−y‖²/2)
    errors = [
        max(
            (kernel_estimate(gmm_rks(16, m, sigma, seed), x, y) - exact).abs().max().item()
            for seed in (1, 2)
        )
        for m in (64, 8192)
    ]
    assert errors[1] < 0.06, errors
    assert errors[1] < errors[0] / 4, errors  # the error falls like 1/√M


def test_gmm_prf_estimates_the_softmax_kernel():
    x, y = pairs(16)
    exact = torch.exp(x @ y.transpose(-1, -2))
    errors = []
    for m in (64, 8192):
        fm = build_map(
            "gmm_prf", head_dim=16, num_heads=1, num_features=m, components=1, generator=gen(4)
        )
        with torch.no_grad():
            fm.mean.zero_()  # log-variance 0: Σ = I
        errors.append(((kernel_estimate(fm, x, y) - exact).abs() / exact).mean().item())
    assert errors[1] < 0.06 and errors[1] < errors[0] / 4, errors  # theory: ≈ 0.04, 0.33


@pytest.mark.parametrize("d", [16, 12])  # 12: padded to 16
@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_fastfood_without_learning_estimates_the_gaussian_kernel(d, sigma):
    x, y = pairs(d)
    exact = gaussian_gram(x, y, 1 / sigma**2)  # exp(−‖x−y‖²/(2σ²))
    errors = []
    for m in (64, 8192):
        fm = build_map(
            "fastfood_rks",
            head_dim=d,
            num_heads=1,
            num_features=m,
            learn="none",
            sigma=sigma,
            generator=gen(5),
        )
        errors.append((kernel_estimate(fm, x, y) - exact).abs().max().item())
    assert errors[1] < 0.05 and errors[1] < errors[0] / 3, errors


# ------------------------------------------------------------------------- the formulas
def test_fastfood_projection_equals_its_matrix_product():
    """V x = (1/(σ√d)) S H G Π H B x per block, with the explicit Hadamard matrix."""
    d, m, sigma = 12, 40, 1.5  # padded to 16; 3 blocks, the last one cut
    fm = build_map(
        "fastfood_prf", head_dim=d, num_heads=2, num_features=m, sigma=sigma, generator=gen(6)
    ).double()
    x = torch.randn(2, 2, 7, d, dtype=torch.float64, generator=gen(7))
    h = hadamard_matrix(16, dtype=torch.float64)
    rows = []
    for head in range(2):
        blocks = []
        for b in range(fm.blocks):
            s, g, sign = (
                getattr(fm, n)[head, b].detach() for n in ("scaling", "gaussian", "signs")
            )
            perm = torch.eye(16, dtype=torch.float64)[fm.permutation[head, b]]  # (Π z)_i = z_π(i)
            s = s / g.norm()  # S = diag(s) / ‖G‖
            v = torch.diag(s) @ h @ torch.diag(g) @ perm @ h @ torch.diag(sign) / (sigma * 4.0)
            blocks.append(v[:, :d])
        rows.append(torch.cat(blocks)[:m])
    v = torch.stack(rows)  # (H, M, D)
    torch.testing.assert_close(fm.project(x, 0.7), math.sqrt(0.7) * x @ v.transpose(-1, -2))
    torch.testing.assert_close(fm.frequencies().double(), v)


def test_gmm_frequencies_follow_the_mixture():
    fm = build_map(
        "gmm_rks", head_dim=8, num_heads=2, num_features=18, components=3, generator=gen(8)
    )
    omega = fm.frequencies()
    assert omega.shape == (2, 18, 8) and fm.noise.shape == (2, 3, 3, 8)  # M/C/2 draws each
    n, mu, sig = fm.noise, fm.mean, fm.scale_matrix
    c = 1
    spread = n[0, c] @ sig[0, c].T
    torch.testing.assert_close(omega[0, 6 * c : 6 * c + 3], spread + mu[0, c])
    torch.testing.assert_close(omega[0, 6 * c + 3 : 6 * c + 6], spread - mu[0, c])  # ± pairs
    fm = build_map(
        "gmm_prf", head_dim=8, num_heads=2, num_features=10, components=2, generator=gen(9)
    )
    with torch.no_grad():
        fm.log_variance.normal_()
    expected = fm.noise[1, 1] * torch.exp(0.5 * fm.log_variance[1, 1]) + fm.mean[1, 1]
    torch.testing.assert_close(fm.frequencies()[1, 5:], expected)


def test_generative_frequencies_come_from_the_network():
    fm = build_map(
        "generative_prf", head_dim=8, num_heads=3, num_features=10, generator=gen(10)
    ).eval()
    assert len([m for m in fm.net if isinstance(m, torch.nn.Linear)]) == 5
    assert len([m for m in fm.net if isinstance(m, torch.nn.BatchNorm1d)]) == 4
    omega = fm.frequencies()
    assert omega.shape == (3, 10, 8) and omega.abs().max() < 1  # tanh output
    torch.testing.assert_close(omega[2], fm.net(fm.noise[20:30]))


@pytest.mark.parametrize("name", SPECTRAL)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_attention_equals_the_reference_on_the_features(name, causal):
    torch.manual_seed(0)
    attn = kattn.build(name, head_dim=16, num_heads=2, num_features=8).double().eval()
    g = gen(11)
    q, k, v = (
        torch.randn(2, 2, 13, 16, dtype=torch.float64, generator=g).requires_grad_()
        for _ in range(3)
    )
    mask = torch.zeros(2, 13, dtype=torch.bool)
    mask[1, -4:] = True
    out = attn(q, k, v, causal=causal, key_padding_mask=None if causal else mask)
    fq, fk = attn.features(q).dense(), attn.features(k).dense()
    ref = linear_attention_reference(
        fq, fk, v, causal=causal, key_padding_mask=None if causal else mask, eps=attn.eps
    )
    torch.testing.assert_close(out, ref)
    w = torch.randn(out.shape, dtype=torch.float64, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    refs = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, refs, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "name, options, learned",
    [
        ("gmm_rks", {}, {"mean", "scale_matrix"}),
        ("gmm_prf", {}, {"mean", "log_variance"}),
        ("fastfood_rks", {}, {"scaling", "gaussian", "signs"}),
        ("fastfood_prf", {"learn": "s"}, {"scaling"}),
        ("fastfood_prf", {"learn": "none"}, set()),
        (
            "generative_rks",
            {},
            {"net." + n for n in ("0.weight", "1.weight", "1.bias", "12.weight", "12.bias")},
        ),
        ("generative_prf", {}, None),
    ],
)
def test_gradients_reach_every_learned_parameter(name, options, learned):
    torch.manual_seed(1)
    attn = kattn.build(name, head_dim=16, num_heads=2, num_features=8, **options).train()
    q, k, v = (x.requires_grad_() for x in torch.randn(3, 2, 2, 11, 16).unbind(0))
    attn(q, k, v).square().sum().backward()
    params = dict(attn.feature_map.named_parameters())
    if learned is not None:
        assert learned <= set(params) and (learned or not params)
    for pname, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


# ------------------------------------------------------------------------- resampling
def draws(fm) -> list[torch.Tensor]:
    return [
        b.clone() for n, b in fm.named_buffers() if "running" not in n and "num_batches" not in n
    ]


@pytest.mark.parametrize("name", SPECTRAL)
def test_noise_is_resampled_exactly_every_n_training_steps_and_never_in_eval(name):
    torch.manual_seed(2)
    attn = kattn.build(name, head_dim=8, num_heads=2, num_features=4, resample_every=3)
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    fm = attn.feature_map
    params = [p.detach().clone() for p in fm.parameters()]
    changed = []
    for _ in range(7):
        before = draws(fm)
        attn.train()(q, k, v)
        changed.append(any(not torch.equal(a, b) for a, b in zip(before, draws(fm), strict=True)))
    assert changed == [False, False, True, False, False, True, False]
    before = draws(fm)
    attn.eval()
    for _ in range(5):
        attn(q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(before, draws(fm), strict=True))
    for a, b in zip(params, fm.parameters(), strict=True):
        assert torch.equal(a, b)  # resampling never touches learned parameters


def two_block_fastfood(learn: str, seed: int, **options):
    """A FastFood-RKS map with two full blocks of 16 frequencies per head (2 heads), whose
    noise is redrawn at every training step."""
    return build_map(
        "fastfood_rks",
        head_dim=16,
        num_heads=2,
        num_features=32,
        learn=learn,
        resample_every=1,
        generator=gen(seed),
        **options,
    )


@pytest.mark.parametrize(
    "learn, redrawn",
    [
        ("sgb", {"permutation"}),
        ("s", {"permutation", "signs", "gaussian"}),
        ("none", {"permutation", "signs", "gaussian", "scaling"}),
    ],
)
def test_fastfood_redraws_only_what_it_does_not_learn(learn, redrawn):
    fm = two_block_fastfood(learn, 12)
    before = {
        n: getattr(fm, n).detach().clone() for n in ("permutation", "signs", "gaussian", "scaling")
    }
    fm.training_step()
    after = {n: getattr(fm, n).detach() for n in before}
    assert {n for n in before if not torch.equal(before[n], after[n])} == redrawn
    assert sorted(fm.permutation[1, 0].tolist()) == list(range(16))


@pytest.mark.parametrize("learn", ["sgb", "s", "none"])
def test_fastfood_rows_have_the_norms_s_over_sigma_across_redraws(learn):
    """Row i of a full block has norm s_i/σ whatever G is, so redrawing G (learn="s") keeps the
    kernel's bandwidth."""
    fm = two_block_fastfood(learn, 13, sigma=2.0)
    for _ in range(3):
        norms = fm.frequencies().norm(dim=-1).detach()  # (H, M)
        torch.testing.assert_close(norms, fm.scaling.detach().flatten(1) / 2.0)
        fm.training_step()


def test_the_form_is_fixed_by_the_name():
    with pytest.raises(TypeError, match="form"):
        kattn.build("gmm_rks", head_dim=8, num_heads=1, form="prf")
    with pytest.raises(TypeError, match="form"):
        kattn.build("kernelized", head_dim=8, num_heads=1, feature_map="fastfood_rks", form="prf")


def test_generative_maps_need_two_noise_vectors():
    with pytest.raises(ValueError, match="two noise vectors"):
        kattn.build("generative_prf", head_dim=8, num_heads=1, num_features=1)


def test_resample_every_never_keeps_the_noise():
    attn = kattn.build("gmm_prf", head_dim=8, num_heads=1, resample_every="never").train()
    before = draws(attn.feature_map)
    for _ in range(4):
        attn(*torch.randn(3, 1, 1, 5, 8).unbind(0))
    assert all(torch.equal(a, b) for a, b in zip(before, draws(attn.feature_map), strict=True))


# ------------------------------------------------------------------------- options
def test_presets_follow_the_paper_table_5():
    # the M of Table 5 for every map; GMM splits it over its components (docs: a departure)
    sizes = {name: kattn.build(name, head_dim=64, num_heads=1).feature_map for name in SPECTRAL}
    assert {n: fm.samples for n, fm in sizes.items()} == {
        "gmm_rks": 256,
        "gmm_prf": 256,
        "fastfood_rks": 64,
        "fastfood_prf": 64,
        "generative_rks": 256,
        "generative_prf": 128,
    }
    assert sizes["gmm_rks"].components == sizes["gmm_prf"].components == 2
    assert sizes["gmm_rks"].num_features == 2 * 256  # M frequencies, cos and sin
    assert sizes["fastfood_prf"].learn == "sgb" and sizes["fastfood_prf"].resample_every == 100
    assert not sizes["gmm_rks"].positive and sizes["gmm_prf"].positive


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("gmm_rks", {"num_features": 6}, "multiple of 4"),
        ("gmm_prf", {"num_features": 7, "components": 2}, "multiple of 2"),
        ("gmm_prf", {"components": 0}, "components"),
        ("fastfood_rks", {"learn": "sg"}, "learn"),
        ("fastfood_prf", {"sigma": 0.0}, "sigma"),
        ("generative_rks", {"hidden_dim": 0}, "hidden_dim"),
        ("generative_prf", {"resample_every": 0}, "resample_every"),
    ],
)
def test_bad_options_are_refused(name, options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build(name, head_dim=8, num_heads=1, **options)


@pytest.mark.parametrize(
    "spectrum, name",
    [
        ("GaussianMixtureFeatures", "gmm"),
        ("FastFoodFeatures", "fastfood"),
        ("GenerativeFeatures", "generative"),
    ],
)
@pytest.mark.parametrize("form", ["rks", "prf"])
def test_a_spectrum_called_with_a_form_is_that_registered_map(spectrum, name, form):
    cls = getattr(kattn.features, spectrum)
    torch.manual_seed(0)
    direct = cls(head_dim=8, num_heads=2, num_features=16, form=form)
    torch.manual_seed(0)
    built = kattn.features.build(f"{name}_{form}", head_dim=8, num_heads=2, num_features=16)
    assert type(direct) is type(built) and isinstance(direct, cls)
    x = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(direct.features(x), built.features(x))
    with pytest.raises(ValueError, match="needs form="):
        cls(head_dim=8, num_heads=2, num_features=16)
    with pytest.raises(ValueError, match=f"is the '{form}' form"):
        type(built)(
            head_dim=8, num_heads=2, num_features=16, form="prf" if form == "rks" else "rks"
        )
