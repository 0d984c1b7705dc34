"""Exact Gaussian-kernel attention and the iterative pseudo-inverse of the Nyström family."""

import pytest
import torch

import kattn
from kattn.functional.gaussian import (
    gaussian_attention,
    gaussian_attention_reference,
    gaussian_kernel,
)
from kattn.functional.nystrom import iterative_pinv

from .helpers import assert_close, grads, padding_mask, qkv


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
