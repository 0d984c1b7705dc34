"""The fast paths under the Nyström cores: the pseudo-inverse applied to a right-hand side, the
Gaussian kernels with a folded scale, in-place weights in the product's backward, no
subnormal kernel entries, and uniform landmark draws."""

import pytest
import torch

import kattn
import kattn.functional.gaussian as gaussian_module
from kattn.functional import gaussian_kernel, gaussian_product, iterative_pinv, iterative_pinv_solve

from ..helpers import assert_close


def matrices(n, symmetric, seed=0, batch=(3,)):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, n, n, generator=g, dtype=torch.float64)
    if symmetric:  # PSD, condition ~1e3: six steps are far from converged
        return a @ a.mT / n + 0.01 * torch.eye(n, dtype=torch.float64)
    return torch.softmax(2 * a, dim=-1)  # Nyströmformer's middle kernel: not symmetric


@pytest.mark.parametrize("iterations", [0, 1, 2, 6])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("init", ["per_matrix", "global"])
def test_pinv_solve_equals_pinv_then_product(iterations, symmetric, init):
    m = matrices(12, symmetric).requires_grad_()
    g = torch.Generator().manual_seed(1)
    rhs = torch.randn(3, 12, 5, generator=g, dtype=torch.float64).requires_grad_()
    grad = torch.randn(3, 12, 5, generator=g, dtype=torch.float64)
    expected = iterative_pinv(m, iterations, init=init) @ rhs
    out = iterative_pinv_solve(m, rhs, iterations, init=init)
    # The two orders of the products round differently; the difference grows with the
    # conditioning of m (and of the iterates), so the tolerance is a multiple of
    # eps · cond(m) · n on the scale of each result, not a fixed number.
    cond = float(torch.linalg.cond(m.detach()).max())
    tol = 64 * torch.finfo(torch.float64).eps * cond * m.shape[-1]
    assert_scaled_close(out, expected, tol)
    for a, b in zip(
        torch.autograd.grad(out, (m, rhs), grad),
        torch.autograd.grad(expected, (m, rhs), grad),
        strict=True,
    ):
        assert_scaled_close(a, b, tol * cond)


def assert_scaled_close(actual, expected, tol):
    """Equal up to ``tol`` relative to the largest entry of ``expected``."""
    scale = float(expected.detach().abs().max().clamp_min(1e-300))
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * scale)


def test_pinv_solve_gradcheck_broadcasting_zero_and_errors():
    m = matrices(6, True, batch=(2, 1)).requires_grad_()
    rhs = torch.randn(1, 3, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: iterative_pinv_solve(a, b, 3), (m, rhs))
    assert iterative_pinv_solve(m, rhs).shape == (2, 3, 6, 2)
    zero = torch.zeros(2, 5, 5, requires_grad=True)  # pinv(0) = 0, finite gradients
    out = iterative_pinv_solve(zero, torch.ones(2, 5, 3))
    out.sum().backward()
    assert not out.any() and torch.isfinite(zero.grad).all()
    with pytest.raises(ValueError, match="rhs"):
        iterative_pinv_solve(zero, torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match="iterations"):
        iterative_pinv_solve(zero, torch.ones(2, 5, 3), -1)


def test_pinv_solve_runs_in_float32_under_autocast():
    m = matrices(8, True).float().requires_grad_()
    rhs = torch.randn(3, 8, 4, requires_grad=True)
    exact = iterative_pinv_solve(m, rhs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = iterative_pinv_solve(m, rhs)
        out.sum().backward()
    assert out.dtype == torch.float32
    assert_close(out, exact)
    assert torch.isfinite(m.grad).all() and torch.isfinite(rhs.grad).all()


@pytest.mark.parametrize("transpose", [False, True])
def test_scale_equals_scaled_inputs(transpose):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 9 if transpose else 5, 3, generator=g, dtype=torch.float64)
    w.requires_grad_()
    s = 0.6
    pairs = [
        (gaussian_kernel(x, y, scale=s), gaussian_kernel(x * s, y * s)),
        (
            gaussian_product(x, y, w, transpose=transpose, scale=s),
            gaussian_product(x * s, y * s, w, transpose=transpose),
        ),
    ]
    for out, expected in pairs:
        assert_close(out, expected)
        cot = torch.randn_like(out)
        for a, b in zip(
            torch.autograd.grad(out, (x, y), cot),
            torch.autograd.grad(expected, (x, y), cot),
            strict=True,
        ):
            assert_close(a, b)
    product = lambda a, b, c: gaussian_product(a, b, c, transpose=transpose, scale=s)  # noqa: E731
    assert torch.autograd.gradcheck(product, (x, y, w))
    assert torch.autograd.gradcheck(lambda a, b: gaussian_kernel(a, b, scale=s), (x, y))


def test_kernel_entries_are_never_subnormal():
    x = torch.zeros(1, 4, 8)
    y = torch.full((1, 3, 8), 10.0)  # exp(−400): below the smallest normal float
    kernel = gaussian_kernel(x, y)
    assert (kernel >= torch.finfo(torch.float32).tiny).all() and (kernel < 1e-37).all()
    assert torch.equal(gaussian_product(x, y, torch.ones(1, 3, 2)), kernel @ torch.ones(1, 3, 2))


@pytest.mark.parametrize("transpose", [False, True])
def test_product_backward_by_blocks_and_twice(transpose, monkeypatch):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 37, 6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 37 if transpose else 5, 3, generator=g, dtype=torch.float64)
    w.requires_grad_()
    cot = torch.randn(2, 5 if transpose else 37, 3, generator=g, dtype=torch.float64)
    kernel = torch.exp(-0.5 * torch.cdist(x, y).square())
    expected = kernel.mT @ w if transpose else kernel @ w
    want = torch.autograd.grad(expected, (x, y, w), cot)
    monkeypatch.setattr(gaussian_module, "WEIGHT_BLOCK_ENTRIES", 2 * 5 * 4)  # blocks of 4 rows
    out = gaussian_product(x, y, w, transpose=transpose)
    first = torch.autograd.grad(out, (x, y, w), cot, retain_graph=True)
    second = torch.autograd.grad(out, (x, y, w), cot)  # the kernel is rebuilt for a second pass
    for a, b, c in zip(first, second, want, strict=True):
        assert_close(a, c)
        assert_close(b, c)


def test_landmark_draws_are_uniform_and_mask_independent():
    attn = kattn.build("skyformer", head_dim=8, num_heads=1, num_landmarks=2000).eval()
    length, bins = 1500, torch.arange(1500) // 150  # 10 bins of 150 rows
    plain, _ = attn.landmarks(2, length, length, None, "cpu")
    unmasked, _ = attn.landmarks(2, length, length, torch.zeros(2, length, dtype=torch.bool), "cpu")
    assert torch.equal(plain, unmasked)  # the same draws with or without an empty mask
    counts = torch.bincount(bins[plain[0, :1000]], minlength=10)
    assert counts.min() > 60 and counts.max() < 140  # ~100 per bin: uniform over the queries
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[1, 300:] = True  # 300 valid positions in the second sequence
    index, ok = attn.landmarks(2, length, length, mask, "cpu")
    assert ok.all() and (index[1] % length < 300).all()
    counts = torch.bincount((index[1, 1000:] - length) // 30, minlength=10)
    assert counts.min() > 60 and counts.max() < 140  # ~100 per bin of 30 valid keys


def test_pinv_solve_saves_through_autograd():
    """Intermediates go through save_for_backward: an in-place change of the right-hand side
    is caught, nothing stays on the graph node, and torch.func transforms work."""
    m = matrices(6, True).requires_grad_()
    rhs = torch.randn(3, 6, 2, dtype=torch.float64, requires_grad=True)
    u = rhs * 1.0
    out = iterative_pinv_solve(m, u, 3)
    u.mul_(2)
    with pytest.raises(RuntimeError, match="inplace"):
        out.sum().backward()
    grad_rhs = torch.func.grad(lambda r: iterative_pinv_solve(m.detach(), r, 3).sum())(rhs)
    expected = torch.autograd.grad((iterative_pinv(m, 3) @ rhs).sum(), rhs)[0]
    assert_close(grad_rhs, expected)
    only_rhs = iterative_pinv_solve(m.detach(), rhs, 4)  # m needs no gradient
    assert_close(
        torch.autograd.grad(only_rhs.sum(), rhs)[0],
        torch.autograd.grad((iterative_pinv(m.detach(), 4) @ rhs).sum(), rhs)[0],
    )


def test_product_kernel_is_saved_through_hooks_and_w_alone_gets_its_gradient():
    x = torch.randn(2, 40, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 6, 4, dtype=torch.float64)
    w = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gaussian_product(x, y, w, scale=0.7)
    assert (2, 40, 6) in packed  # the (L, S) kernel is visible to checkpointing/offloading
    out.sum().backward()
    expected = torch.exp(-0.5 * 0.49 * torch.cdist(x, y).square()) @ w
    assert_close(torch.autograd.grad(expected.sum(), x)[0], x.grad)
    w_only = gaussian_product(x.detach(), y, w)  # only w needs a gradient
    kernel = torch.exp(-0.5 * torch.cdist(x.detach(), y).square())
    assert_close(
        torch.autograd.grad(w_only.sum(), w)[0],
        kernel.mT @ torch.ones(2, 40, 3, dtype=torch.float64),
    )
