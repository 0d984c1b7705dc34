"""The identity start of the hyper-power iteration (Skyformer, Chen et al. 2021, §4.4): the
applied form equals the formed one, it converges on Skyformer's preconditioned cores, and the
options that name it are validated."""

import math

import pytest
import torch

import kattn
from kattn.functional import gaussian_kernel, iterative_pinv, iterative_pinv_solve

from .test_pinv_and_kernel_paths import assert_scaled_close

BERT_INIT_STD = 0.02 * math.sqrt(768)


def skyformer_cores(n=128, d=64, batch=3, seed=0, std=BERT_INIT_STD):
    """``D^{-½}(κ(X, X) + γI)D^{-½}`` for n rows X at the initialisation scale of BERT-base
    (Skyformer's preconditioned core with every row of [Q; K] a landmark)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, d, generator=g, dtype=torch.float64) * std
    core = gaussian_kernel(x, x, scale=d**-0.25) + 0.1 * torch.eye(n, dtype=torch.float64)
    d_half = core.sum(dim=-1, keepdim=True).rsqrt()
    return d_half * core * d_half.mT


def near_identity(n, seed=0):
    """Non-symmetric ``I − 0.9 R/‖R‖₂``: ``‖I − M‖₂ = 0.9 < 1``."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(3, n, n, generator=g, dtype=torch.float64)
    return (
        torch.eye(n, dtype=torch.float64)
        - 0.9 * r / torch.linalg.matrix_norm(r, ord=2)[:, None, None]
    )


def relative_error(approx, exact):
    return float((torch.linalg.matrix_norm(approx - exact) / torch.linalg.matrix_norm(exact)).max())


@pytest.mark.parametrize("iterations", [0, 1, 2, 6])
@pytest.mark.parametrize("kind", ["skyformer-core", "near-identity"])
def test_identity_start_solve_equals_pinv_then_product(iterations, kind):
    m = skyformer_cores(12, d=8) if kind == "skyformer-core" else near_identity(12)
    m.requires_grad_()
    g = torch.Generator().manual_seed(1)
    rhs = torch.randn(3, 12, 5, generator=g, dtype=torch.float64).requires_grad_()
    grad = torch.randn(3, 12, 5, generator=g, dtype=torch.float64)
    expected = iterative_pinv(m, iterations, init="identity") @ rhs
    out = iterative_pinv_solve(m, rhs, iterations, init="identity")
    cond = float(torch.linalg.cond(m.detach()).max())
    tol = 64 * torch.finfo(torch.float64).eps * cond * m.shape[-1]
    assert_scaled_close(out, expected, tol)
    both = {"allow_unused": True, "materialize_grads": True}  # 0 steps: m is not used
    for a, b in zip(
        torch.autograd.grad(out, (m, rhs), grad, **both),
        torch.autograd.grad(expected, (m, rhs), grad, **both),
        strict=True,
    ):
        assert_scaled_close(a, b, tol * cond)


def test_identity_start_gradcheck_and_no_iterations():
    m = near_identity(6).requires_grad_()
    rhs = torch.randn(3, 6, 2, dtype=torch.float64, requires_grad=True)
    solve = lambda a, b: iterative_pinv_solve(a, b, 3, init="identity")  # noqa: E731
    assert torch.autograd.gradcheck(solve, (m, rhs))
    assert torch.autograd.gradcheck(lambda a: iterative_pinv(a, 3, init="identity"), (m,))
    assert torch.equal(iterative_pinv_solve(m, rhs, 0, init="identity"), rhs)  # Z₀ = I
    assert torch.equal(iterative_pinv(m, 0, init="identity"), torch.eye(6).expand(3, 6, 6))


def test_identity_start_converges_on_skyformer_cores():
    """With every row a landmark (the review's case) six steps from Z₀ = I invert the core to
    rounding, while the Mᵀ starts are still far off; more steps keep converging."""
    core = skyformer_cores()
    assert float(torch.linalg.matrix_norm(torch.eye(128) - core, ord=2).max()) < 1  # Lemma 3
    exact = torch.linalg.inv(core)
    errors = [relative_error(iterative_pinv(core, n, init="identity"), exact) for n in (1, 3, 6)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-8
    for init in ("per_matrix", "global"):
        assert relative_error(iterative_pinv(core, 6, init=init), exact) > 0.05
        assert relative_error(iterative_pinv(core, 40, init=init), exact) < 1e-8


def test_identity_start_is_the_skyformer_default_and_closer_to_the_exact_inverse():
    assert kattn.build("skyformer", head_dim=64, num_heads=2).pinv_init == "identity"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g, dtype=torch.float64) for _ in range(3))
    q, k = q * BERT_INIT_STD, k * BERT_INIT_STD
    out = {}
    for init in ("identity", "per_matrix", None):
        options = {"pinv_iterations": None} if init is None else {"pinv_init": init}
        out[init] = kattn.build("skyformer", head_dim=64, num_heads=2, **options).eval()(q, k, v)
    assert relative_error(out["identity"], out[None]) < 1e-8
    assert relative_error(out["per_matrix"], out[None]) > 1e-3


def test_pinv_init_options_are_validated():
    with pytest.raises(ValueError, match="pinv_init"):
        kattn.build("skyformer", head_dim=16, num_heads=2, pinv_init="eye")
    with pytest.raises(ValueError, match=r"pinv_init.*softmax kernel"):  # diverges there
        kattn.build("nystromformer", head_dim=16, num_heads=2, pinv_init="identity")
    for fn in (iterative_pinv, lambda m, **kw: iterative_pinv_solve(m, m, **kw)):
        with pytest.raises(ValueError, match="init must be one of"):
            fn(torch.eye(3), init="eye")
