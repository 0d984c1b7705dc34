"""Exact Gaussian-kernel attention and the iterative pseudo-inverse of the Nyström family."""

import itertools

import pytest
import torch

import kattn
from kattn.functional.gaussian import (
    gaussian_attention,
    gaussian_attention_reference,
    gaussian_kernel,
    gaussian_product,
)
from kattn.functional.nystrom import (
    iterative_pinv,
    nystromformer_attention,
    nystromformer_attention_reference,
    skyformer_attention,
)

from ..helpers import assert_close, grads, padding_mask, qkv


@pytest.mark.parametrize(("lq", "lk", "causal"), [(1, 1, False), (17, 17, True), (13, 21, False)])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_gaussian_equals_its_definition(lq, lk, causal, scale):
    q, k, v = qkv(lq=lq, lk=lk, scale=scale, requires_grad=True)
    mask = padding_mask(2, lk, (min(3, lk - 1), 0))
    out = gaussian_attention(q, k, v, causal=causal, key_padding_mask=mask)
    ref = gaussian_attention_reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


def test_gaussian_has_no_row_normalisation_and_survives_huge_norms():
    q, k, v = qkv(lq=5, d=16)
    ones = torch.ones_like(v)
    out = gaussian_attention(q, q, ones)  # each row sums its kernel: not 1
    assert (out[..., 0] > 1.0).all()  # self-similarity 1 plus positive others
    big = gaussian_attention(q * 1e4, k * 1e4, v)
    assert torch.isfinite(big).all()


def test_gaussian_mechanism():
    attn = kattn.build("gaussian", head_dim=16, num_heads=3)
    assert attn.is_exact and attn.supports_causal and not attn.supports_recurrent
    q, k, v = qkv(lq=9, d=16, dtype=torch.float32)
    torch.testing.assert_close(attn(q, k, v), gaussian_attention_reference(q, k, v))
    with pytest.raises(ValueError, match="dropout"):
        kattn.build("gaussian", head_dim=16, num_heads=3, dropout=1.0)


@pytest.mark.parametrize("transpose", [False, True])
def test_fused_gaussian_product_and_kernel_have_exact_gradients(transpose):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 7 if transpose else 4, 6, generator=g, dtype=torch.float64)
    w.requires_grad_()
    product = lambda a, b, c: gaussian_product(a, b, c, transpose=transpose)  # noqa: E731
    assert torch.autograd.gradcheck(product, (x, y, w))
    assert torch.autograd.gradcheck(gaussian_kernel, (x, y))
    kernel = torch.exp(-0.5 * torch.cdist(x, y).square())
    expected = kernel.transpose(-1, -2) @ w if transpose else kernel @ w
    assert_close(product(x, y, w), expected)
    assert_close(gaussian_kernel(x, x).diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 7))
    with pytest.raises(ValueError, match="w must be"):
        gaussian_product(x, y, w[..., :2, :], transpose=transpose)


def psd(n, cond, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), n, dtype=torch.float64)
    return basis @ torch.diag(eig) @ basis.T


def relative_error(m, iterations, **kwargs):
    exact = torch.linalg.pinv(m)
    return float((iterative_pinv(m, iterations, **kwargs) - exact).norm() / exact.norm())


def test_iterative_pinv_on_skyformer_matrices_converges_in_six_steps():
    """The preconditioned D^-½(κ(S,S) + γI)D^-½ of Skyformer (eigenvalues in (0, 1])."""
    g = torch.Generator().manual_seed(0)
    for n in (32, 128):
        x = torch.randn(n, 32, generator=g, dtype=torch.float64) * 32**-0.25
        m = gaussian_kernel(x, x) + 0.1 * torch.eye(n, dtype=torch.float64)
        d = m.sum(dim=-1).rsqrt()
        assert relative_error(d[:, None] * m * d[None, :], 6) < 1e-10


def test_iterative_pinv_on_generic_psd_matrices():
    well, ill = psd(16, 10.0), psd(16, 1e4, seed=1)
    errors = [relative_error(well, it) for it in (2, 4, 6, 20)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-10
    assert relative_error(ill, 6) > 0.1  # six steps are far from enough at condition 1e4
    assert relative_error(ill, 40) < 1e-6  # but the iteration converges


def test_global_init_of_the_released_code():
    well = psd(16, 10.0)
    batch = torch.stack([well, 100 * well])
    assert_close(iterative_pinv(batch, 30), torch.linalg.pinv(batch))
    # one scale for the whole batch (released default): the small matrix barely moves
    glob = iterative_pinv(batch, 6, init="global")
    assert float((glob[0] - torch.linalg.pinv(well)).norm() / torch.linalg.pinv(well).norm()) > 0.1
    with pytest.raises(ValueError, match="init"):
        iterative_pinv(well, init="exact")
    with pytest.raises(ValueError, match="n, n"):
        iterative_pinv(torch.zeros(3, 4))
    zero = torch.zeros(2, 5, 5, requires_grad=True)  # pinv(0) = 0, finite gradient
    inverse = iterative_pinv(zero, 6)
    inverse.sum().backward()
    assert not inverse.any() and torch.isfinite(zero.grad).all()


def dense_skyformer(q, k, v, index, gamma):
    """C̄_{Q,S} (C̄_{S,S} + γI)^{-1} C̄_{S,K} V written out with explicit matrices."""
    x = torch.cat([q, k], dim=2) * q.shape[-1] ** -0.25
    xs = torch.stack([x[b][:, index[b]] for b in range(x.shape[0])])
    lq = q.shape[2]
    kernel = lambda a, b: torch.exp(-0.5 * torch.cdist(a, b).square())  # noqa: E731
    core = kernel(xs, xs) + gamma * torch.eye(xs.shape[2], dtype=x.dtype)
    return kernel(x[:, :, :lq], xs) @ torch.linalg.solve(core, kernel(xs, x[:, :, lq:]) @ v)


@pytest.mark.parametrize("iterations", [None, 6])
def test_skyformer_equals_the_dense_nystrom_formula(iterations):
    q, k, v = qkv(lq=20, lk=24, d=16, requires_grad=True)
    g = torch.Generator().manual_seed(1)
    index = torch.randint(0, 44, (2, 12), generator=g)
    out = skyformer_attention(q, k, v, index, gamma=0.1, iterations=iterations)
    ref = dense_skyformer(q, k, v, index, 0.1)
    if iterations is None:
        assert_close(out, ref)
    else:  # six hyper-power steps on the preconditioned matrix
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-8)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_skyformer_masks_equal_the_dense_formula_without_the_masked():
    q, k, v = qkv(lq=20, lk=24, d=16, requires_grad=True)
    g = torch.Generator().manual_seed(2)
    index = torch.randint(0, 40, (2, 12), generator=g)  # none among the last 4 keys
    mask = padding_mask(2, 24, (0, 4))
    ok = torch.ones(2, 12, dtype=torch.bool)
    ok[1, :3] = False  # three ignored landmarks in the second batch row
    for b in range(2):
        out = skyformer_attention(
            q, k, v, index, landmark_mask=ok, key_padding_mask=mask, iterations=None
        )
        kept = index[b][ok[b]][None]
        lk = 24 - 4 * b
        ref = dense_skyformer(q[b : b + 1], k[b : b + 1, :, :lk], v[b : b + 1, :, :lk], kept, 0.1)
        assert_close(out[b : b + 1], ref)
        for a, r in zip(grads(out[b], q, k, v), grads(ref[0], q, k, v), strict=True):
            assert_close(a, r)


def test_skyformer_with_every_row_as_landmark_tends_to_gaussian():
    q, k, v = qkv(lq=8, d=16)
    exact = gaussian_attention(q, k, v)
    index = torch.arange(16).expand(2, -1)
    errors = []
    for gamma in (1e-2, 1e-4, 1e-6):
        out = skyformer_attention(q, k, v, index, gamma=gamma, iterations=None)
        errors.append(float((out - exact).norm() / exact.norm()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3


def test_skyformer_landmarks():
    attn = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=8)
    assert not attn.supports_causal
    mask = padding_mask(2, 30, (0, 12))
    attn.eval()
    first = attn.landmarks(2, 30, 30, mask, "cpu")
    assert torch.equal(first[0], attn.landmarks(2, 30, 30, mask, "cpu")[0])  # fixed in eval
    index, ok = first
    assert ok.all() and (index[1] % 30 < 18).all()  # never a padded row of batch 1
    assert (index[:, :4] < 30).all() and (index[:, 4:] >= 30).all()  # half Q rows, half K
    attn.train()
    draws = {tuple(attn.landmarks(2, 30, 30, mask, "cpu")[0].flatten().tolist()) for _ in range(5)}
    assert len(draws) > 1  # redrawn in training
    small, ok = attn.landmarks(2, 3, 3, mask[:, :3], "cpu")  # 2L <= landmarks: every row
    assert small.shape == (2, 6) and ok.all()
    with pytest.raises(NotImplementedError, match="gaussian"):
        attn(*qkv(lq=5, d=16, h=2, dtype=torch.float32), causal=True)
    with pytest.raises(ValueError, match="pinv_init"):
        kattn.build("skyformer", head_dim=16, num_heads=2, pinv_init="exact")


@pytest.mark.parametrize("length", [30, 3])  # 3: every row is a landmark
def test_skyformer_padding_garbage_and_no_mask(length):
    attn = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=8).eval()
    q, k, v = qkv(lq=length, h=2, d=16, dtype=torch.float32, requires_grad=True)
    mask = padding_mask(2, length, (0, 1))
    out = attn(q, k, v, key_padding_mask=mask)
    nan = [x.detach().clone() for x in (q, k, v)]
    for x in nan:
        x[1, :, -1] = float("nan")  # padded position: NaN everywhere
    out_nan = attn(*nan, key_padding_mask=mask)
    torch.testing.assert_close(out_nan[:, :, : length - 1], out[:, :, : length - 1])
    out[:, :, : length - 1].sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert not k.grad[1, :, -1].any() and not v.grad[1, :, -1].any()  # padded keys: no grad
    no_pad = torch.zeros(2, length, dtype=torch.bool)
    torch.testing.assert_close(attn(q, k, v), attn(q, k, v, key_padding_mask=no_pad))


def test_skyformer_under_autocast_runs_its_kernels_in_float32():
    attn = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=8).eval()
    q, k, v = qkv(lq=40, h=2, d=16, dtype=torch.float32, requires_grad=True)
    exact = attn(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(q, k, v)
        (out.float() * 2).sum().backward()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, exact)
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_gaussian_kernel_broadcasts_and_grads_each_input_alone():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64)
    y = torch.randn(1, 3, 5, 4, generator=g, dtype=torch.float64)
    w = torch.randn(5, 2, generator=g, dtype=torch.float64)
    expected = torch.exp(-0.5 * torch.cdist(x, y.expand(2, -1, -1, -1)).square())
    assert_close(gaussian_kernel(x, y), expected)
    assert_close(gaussian_product(x, y, w), expected @ w)
    for i in range(3):  # only one input needs a gradient
        args = [t.clone().requires_grad_(j == i) for j, t in enumerate((x, y, w))]
        assert torch.autograd.gradcheck(gaussian_product, args)
    assert gaussian_kernel(x[:, :, :0], y).shape == (2, 3, 0, 5)


def nystrom_reference(q, k, v, m, mask=None):
    """The three kernels written out with explicit segment means (float64, 100 pinv steps
    replaced by the exact pseudo-inverse)."""
    d = q.shape[-1]
    sizes = [len(s) for s in torch.arange(q.shape[2]).tensor_split(m)]
    sizes = sorted(sizes)  # the longer segments last
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()

    def means(x, valid):
        out = []
        for a, b in itertools.pairwise(bounds):
            w = valid[:, a:b].to(x.dtype)[:, None, :, None]
            out.append((x[:, :, a:b] * w).sum(2) / w.sum(2).clamp_min(1))
        return torch.stack(out, dim=2)

    valid = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool) if mask is None else ~mask
    ql, kl = means(q, valid), means(k, valid)
    s = d**-0.5
    keep = valid[:, None, None, :]
    k1 = torch.softmax(q @ kl.transpose(-1, -2) * s, -1)
    k2 = torch.softmax(ql @ kl.transpose(-1, -2) * s, -1)
    k3 = torch.softmax((ql @ k.transpose(-1, -2) * s).masked_fill(~keep, -torch.inf), -1)
    return k1 @ torch.linalg.pinv(k2) @ k3 @ v.masked_fill(~keep.transpose(-1, -2), 0.0)


@pytest.mark.parametrize(("length", "m"), [(24, 6), (23, 5), (16, 16)])
def test_nystromformer_equals_its_three_kernels(length, m):
    q, k, v = qkv(lq=length, d=16)
    # (3 padded keys: every segment keeps a valid token)
    mask = padding_mask(2, length, (0, 3)) if length % m == 0 and length > m else None
    out = nystromformer_attention(q, k, v, m, key_padding_mask=mask, iterations=60)
    ref = nystromformer_attention_reference(q, k, v, m, key_padding_mask=mask, iterations=60)
    assert_close(out, ref)
    assert_close(out, nystrom_reference(q, k, v, m, mask))


@pytest.mark.parametrize(
    ("lq", "lk", "m", "pads"),
    [(24, 24, 6, None), (24, 24, 6, (0, 9)), (23, 23, 5, (4, 23)), (11, 29, 4, (0, 5))],
)
def test_nystromformer_fused_kernels_equal_the_explicit_ones(lq, lk, m, pads):
    # (0, 9) pads whole segments; (4, 23) a whole sequence; (11, 29) is cross-attention
    q, k, v = qkv(lq=lq, lk=lk, requires_grad=True)
    mask = None if pads is None else padding_mask(2, lk, pads)
    out = nystromformer_attention(q, k, v, m, key_padding_mask=mask)
    ref = nystromformer_attention_reference(q, k, v, m, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, b)


def test_nystromformer_mechanism():
    attn = kattn.build("nystromformer", head_dim=16, num_heads=3, num_landmarks=4).eval()
    q, k, v = qkv(lq=30, d=16, dtype=torch.float32)
    mask = padding_mask(2, 30, (0, 7))
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[1, :, 23:] = 50.0  # padded positions: garbage
    out, out2 = attn(q, k, v, key_padding_mask=mask), attn(q2, k2, v2, key_padding_mask=mask)
    torch.testing.assert_close(out[:, :, :23], out2[:, :, :23])
    exact = kattn.build("softmax", head_dim=16, num_heads=3)(q, k, v)
    small = kattn.build("nystromformer", head_dim=16, num_heads=3, num_landmarks=64)
    torch.testing.assert_close(small(q, k, v), exact)  # short sequences: exact softmax
    conv = kattn.build("nystromformer", head_dim=16, num_heads=3, conv_kernel_size=5)
    assert conv.conv.shape == (3, 1, 5, 1)
    assert not torch.allclose(conv(q, k, v), exact)
    with pytest.raises(NotImplementedError, match="future"):
        attn(q, k, v, causal=True)
    with pytest.raises(ValueError, match="odd"):
        kattn.build("nystromformer", head_dim=16, num_heads=3, conv_kernel_size=4)


def test_linformer_projects_keys_and_values_along_the_sequence():
    torch.manual_seed(0)
    attn = kattn.build("linformer", head_dim=16, num_heads=3, max_len=40, proj_dim=8)
    assert attn.projection.shape == (3, 1, 8, 40) and attn.limits_length
    q, k, v = qkv(lq=25, lk=30, d=16, dtype=torch.float32)
    mask = padding_mask(2, 30, (0, 6))
    e = attn.projection[:, 0, :, :30].detach()
    keep = (~mask)[:, None, :, None]
    k_proj, v_proj = e @ (k * keep), e @ (v * keep)
    expected = torch.softmax(q @ k_proj.transpose(-1, -2) / 4.0, dim=-1) @ v_proj
    torch.testing.assert_close(attn(q, k, v, key_padding_mask=mask), expected)
    separate = kattn.build(
        "linformer",
        head_dim=16,
        num_heads=3,
        max_len=40,
        proj_dim=8,
        share_kv=False,
        share_heads=True,
    )
    assert separate.projection.shape == (1, 2, 8, 40)
    shared = torch.nn.Parameter(torch.randn(3, 1, 8, 40))
    layers = [
        kattn.build(
            "linformer", head_dim=16, num_heads=3, max_len=40, proj_dim=8, projection=shared
        )
        for _ in range(2)
    ]
    assert all(layer.projection is shared for layer in layers)
    with pytest.raises(ValueError, match="projection"):
        kattn.build("linformer", head_dim=16, num_heads=3, max_len=40, projection=shared)
    with pytest.raises(ValueError, match="max_len"):
        attn(*qkv(lq=41, d=16, dtype=torch.float32))
    with pytest.raises(NotImplementedError, match="future"):
        attn(*qkv(lq=10, d=16, dtype=torch.float32), causal=True)
