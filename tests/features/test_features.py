"""Feature maps: formulas, unbiasedness, sampling schemes, redraw policy, numerics."""

import math

import pytest
import torch
import torch.nn.functional as F

import kattn
from kattn.features.sampling import orthogonal_projection, sample_projection, sphere_projection

from ..helpers import assert_close

D = 8


def build(name, **options):
    torch.manual_seed(0)
    return kattn.features.build(name, head_dim=D, num_heads=2, **options).double()


def test_prf_formula():
    fm = build("prf", num_features=12)
    x = torch.randn(2, 2, 5, D, dtype=torch.float64)
    w = fm.projection
    expected = torch.exp(x @ w.T - 0.5 * x.square().sum(-1, keepdim=True)) / math.sqrt(12)
    assert_close(fm.features(x), expected)
    assert_close(fm.features(x, scale=0.3), fm.features(x * math.sqrt(0.3)))
    values = fm(x).values
    assert values.amax(-1).sub(1).abs().max() < 1e-12 and (values > 0).all()


def test_trf_formula():
    fm = build("trf", num_features=12)
    x = torch.randn(2, 2, 5, D, dtype=torch.float64)
    u = x @ fm.projection.T
    expected = (
        torch.cat([u.sin(), u.cos()], -1)
        * torch.exp(0.5 * x.square().sum(-1, keepdim=True))
        / math.sqrt(6)
    )
    assert fm.projection.shape == (6, D)
    assert_close(fm.features(x), expected)


@pytest.mark.parametrize(
    ("name", "fn"),
    [("elu", lambda x: F.elu(x) + 1), ("relu", F.relu), ("identity", lambda x: x)],
)
def test_deterministic_maps(name, fn):
    fm = build(name)
    x = torch.randn(2, 2, 5, D, dtype=torch.float64)
    assert_close(fm.features(x), fn(x))
    assert_close(fm.features(x, scale=4.0), fn(2 * x))
    assert fm.num_features == D and fm(x).log_scale is None


@pytest.mark.parametrize("name", ["prf", "trf"])
@pytest.mark.parametrize("sampling", ["gaussian", "orthogonal"])
def test_random_features_are_unbiased_for_exp_dot(name, sampling):
    """Averaged over independent draws, φ(x)·φ(y) → exp(x·y) (fixed seeds, 4000 draws)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(D, generator=g, dtype=torch.float64) * 0.3
    y = torch.randn(D, generator=g, dtype=torch.float64) * 0.3
    fm = kattn.features.build(
        name,
        head_dim=D,
        num_heads=1,
        num_features=D,
        sampling=sampling,
        generator=torch.Generator().manual_seed(4),
    )
    fm = fm.double()
    estimates = []
    for _ in range(4000):
        fm.redraw_features()
        estimates.append((fm.features(x[None]) * fm.features(y[None])).sum())
    estimate = torch.stack(estimates)
    exact = torch.exp(x @ y)
    stderr = estimate.std() / math.sqrt(len(estimates))
    assert abs(estimate.mean() - exact) < 4 * stderr + 1e-3


def test_orthogonal_rows_are_orthogonal_within_blocks():
    w = orthogonal_projection(20, D, torch.Generator().manual_seed(0)).double()
    for start in range(0, 20, D):
        block = w[start : start + D]
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 1e-4 * gram.abs().max()
    norms = w.norm(dim=1)
    assert norms.std() > 0.1  # chi-distributed, not constant
    big = orthogonal_projection(4000, D, torch.Generator().manual_seed(1)).double()
    assert abs(big.norm(dim=1).square().mean() - D) < 0.3  # E‖w‖² = D


def test_sphere_rows_have_norm_sqrt_d():
    w = sphere_projection(50, D, torch.Generator().manual_seed(0))
    assert_close(w.norm(dim=1), torch.full((50,), math.sqrt(D)), dtype=torch.float32)


def test_sampling_is_validated():
    with pytest.raises(ValueError, match="sampling"):
        sample_projection("uniform", 4, D)
    with pytest.raises(ValueError, match="sampling"):
        build("prf", sampling="uniform")
    with pytest.raises(ValueError, match="num_features"):
        build("prf", num_features=0)
    with pytest.raises(ValueError, match="multiple of 2"):
        build("trf", num_features=7)
    with pytest.raises(ValueError, match="redraw"):
        build("prf", redraw=0)


def test_generator_makes_draws_reproducible():
    a = kattn.features.build(
        "prf", head_dim=D, num_heads=1, generator=torch.Generator().manual_seed(7)
    )
    b = kattn.features.build(
        "prf", head_dim=D, num_heads=1, generator=torch.Generator().manual_seed(7)
    )
    assert torch.equal(a.projection, b.projection)


def test_redraw_schedule_in_training_only():
    attn = kattn.build("performer", head_dim=D, num_heads=1, redraw=3)
    q = torch.randn(1, 1, 4, D)
    first = attn.feature_map.projection.clone()
    attn.train()
    attn(q, q, q)
    attn(q, q, q)
    assert torch.equal(attn.feature_map.projection, first)
    attn(q, q, q)  # the third training forward draws new features
    assert not torch.equal(attn.feature_map.projection, first)
    drawn = attn.feature_map.projection.clone()
    attn.eval()
    for _ in range(5):
        attn(q, q, q)
    assert torch.equal(attn.feature_map.projection, drawn)


def test_never_redraw():
    attn = kattn.build("performer", head_dim=D, num_heads=1, redraw="never").train()
    first = attn.feature_map.projection.clone()
    q = torch.randn(1, 1, 4, D)
    for _ in range(5):
        attn(q, q, q)
    assert torch.equal(attn.feature_map.projection, first)


def test_projection_is_in_the_state_dict():
    attn = kattn.build("rfa", head_dim=D, num_heads=1)
    assert "feature_map.projection" in attn.state_dict()


def test_redraw_schedule_travels_in_the_state_dict():
    """A model loaded from a checkpoint redraws at the same steps as the one that saved it."""
    q = torch.randn(1, 1, 4, D)
    attn = kattn.build("performer", head_dim=D, num_heads=1, redraw=3).train()
    attn(q, q, q), attn(q, q, q)  # two of three forwards before the next draw
    copy = kattn.build("performer", head_dim=D, num_heads=1, redraw=3).train()
    copy.load_state_dict(attn.state_dict())
    before = copy.feature_map.projection.clone()
    copy(q, q, q)  # the third: draws now
    assert not torch.equal(copy.feature_map.projection, before)
    fresh = kattn.build("performer", head_dim=D, num_heads=1, redraw=3).train()
    before = fresh.feature_map.projection.clone()
    fresh(q, q, q)
    assert torch.equal(fresh.feature_map.projection, before)
    with pytest.raises(ValueError, match="steps_since_redraw"):
        copy.feature_map.set_extra_state({"steps": 1})


@pytest.mark.parametrize("name", ["rfa", "performer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_large_norms_give_bounded_fp32_features(name, dtype):
    attn = kattn.build(name, head_dim=64, num_heads=1, num_features=64)
    x = (F.normalize(torch.randn(1, 1, 10, 64), dim=-1) * 50).to(dtype)
    out = attn.features(x)
    assert out.values.dtype == torch.float32 and out.log_scale.dtype == torch.float32
    assert torch.isfinite(out.values).all() and torch.isfinite(out.log_scale).all()
    assert out.values.abs().max() <= 1.0


def test_module_cast_to_half_still_computes_features_in_fp32():
    """model.half() casts the projection buffer too; the maths stays fp32 (upcast on use)."""
    torch.manual_seed(0)
    attn = kattn.build("performer", head_dim=D, num_heads=1)
    q = torch.randn(1, 1, 6, D).half()
    attn.half()
    assert attn.feature_map.projection.dtype == torch.float16
    out = attn(q, q, q)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert attn.features(q).values.dtype == torch.float32
    reference = attn.float()(q.float(), q.float(), q.float())  # same (fp16-rounded) projection
    assert_close(out, reference)


@pytest.mark.parametrize("options", [{}, {"normalize_qk": True}, {"scale": 1.0}])
def test_redraw_between_forwards_keeps_earlier_graphs_valid(options):
    """Gradient accumulation: two training forwards (a redraw between them), one backward."""
    attn = kattn.build("performer", head_dim=D, num_heads=1, redraw=1, **options).train()
    q = torch.randn(1, 1, 5, D, requires_grad=True)
    first = attn(q, q, q)
    second = attn(q, q, q)
    (first.sum() + second.sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_checkpointing_sees_the_features_of_its_forward():
    """Recomputation inside backward is the same step: no redraw, equal gradients."""
    from torch.utils.checkpoint import checkpoint

    def gradient(use_checkpoint):
        torch.manual_seed(0)
        # redraw=2: the recomputation would be the second call, the one that redraws
        attn = kattn.build("performer", head_dim=D, num_heads=1, redraw=2).train()
        q = torch.randn(1, 1, 7, D, requires_grad=True)
        out = checkpoint(attn, q, q, q, use_reentrant=False) if use_checkpoint else attn(q, q, q)
        out.square().sum().backward()
        return q.grad

    assert_close(gradient(True), gradient(False))


@pytest.mark.parametrize("name", ["elu", "relu", "identity", "prf", "trf"])
def test_query_values_are_the_feature_values(name):
    fm = build(name)
    x = torch.randn(2, 2, 5, D, dtype=torch.float64)
    assert torch.equal(fm.query_values(x, scale=0.5), fm(x, scale=0.5).values)
