"""Second derivatives through the Triton kernels (a gradient penalty): the first backward
with ``create_graph=True`` takes the PyTorch path's graph, so the penalty's gradient equals
the PyTorch path's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

pytest.importorskip("triton")
from kattn.functional import banded_linear_attention, decay_linear_attention, linear_attention
from kattn.functional.rpe_blocked import ToeplitzRows, rpe_linear_attention_blocked
from kattn.ops.triton.banded import banded_linear_attention_triton
from kattn.ops.triton.causal_linear import causal_linear_attention_triton
from kattn.ops.triton.decay import decay_linear_attention_triton
from kattn.ops.triton.noncausal_linear import linear_attention_triton
from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton

from .kernel_device import DEVICE, needs_kernels

pytestmark = needs_kernels


def _penalty_grads(attend: Callable[..., Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """Gradients of ``|∂ Σ attend(inputs)² / ∂ inputs|²`` with respect to the inputs."""
    leaves = [x.detach().to(DEVICE).requires_grad_() for x in inputs]
    out = attend(*leaves)
    first = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    penalty = sum(g.square().sum() for g in first)
    return [g.cpu() for g in torch.autograd.grad(penalty, leaves)]


def _inputs() -> list[Tensor]:
    g = torch.Generator().manual_seed(0)
    fq = torch.rand(1, 2, 20, 16, generator=g, dtype=torch.float64) + 0.1
    fk = torch.rand(1, 2, 20, 16, generator=g, dtype=torch.float64) + 0.1
    v = torch.randn(1, 2, 20, 16, generator=g, dtype=torch.float64)
    s = torch.randn(1, 2, 20, generator=g, dtype=torch.float64)
    return [fq, fk, v, s]


@pytest.mark.parametrize("causal", [True, False])
def test_gradient_penalty_through_the_linear_kernels_equals_the_pytorch_path(
    causal: bool,
) -> None:
    kernel = causal_linear_attention_triton if causal else linear_attention_triton

    def by_kernel(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        return kernel(fq, fk, v, k_log_scale=s)

    def by_torch(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        return linear_attention(fq, fk, v, causal=causal, k_log_scale=s)

    got, want = _penalty_grads(by_kernel, _inputs()), _penalty_grads(by_torch, _inputs())
    assert any(w.abs().max() > 1e-3 for w in want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_gradient_penalty_through_the_decay_kernel_equals_the_pytorch_path() -> None:
    log_alpha = torch.zeros(2, 2, 2, dtype=torch.float64)
    log_gamma = torch.tensor([[-0.1, -0.7]], dtype=torch.float64).expand(2, 2, 2)

    def by_kernel(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        a, g = log_alpha.to(fq.device), log_gamma.to(fq.device)
        return decay_linear_attention_triton(fq, fk, v, a, g, causal=True, k_log_scale=s)

    def by_torch(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        return decay_linear_attention(fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s)

    got, want = _penalty_grads(by_kernel, _inputs()), _penalty_grads(by_torch, _inputs())
    assert any(w.abs().max() > 1e-3 for w in want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_gradient_penalty_through_the_window_kernels_equals_the_pytorch_paths() -> None:
    """The exact Toeplitz and the banded kernels, whose first backward without a graph runs
    kernels of their own, take the PyTorch paths' graph under ``create_graph=True``."""
    g = torch.Generator().manual_seed(1)
    table = torch.randn(2, 39, generator=g, dtype=torch.float64)
    band = torch.randn(2, 7, generator=g, dtype=torch.float64)

    def by_kernel(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        t, b = table.to(fq.device), band.to(fq.device)
        out = toeplitz_linear_attention_triton(fq, fk, v, t, k_log_scale=s)
        return out + banded_linear_attention_triton(fq, fk, v, b, 3, causal=True, k_log_scale=s)

    def by_torch(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor) -> Tensor:
        rows = ToeplitzRows(table, fq.shape[2])
        out = rpe_linear_attention_blocked(fq, fk, v, rows, k_log_scale=s)
        return out + banded_linear_attention(fq, fk, v, band, 3, causal=True, k_log_scale=s)

    got, want = _penalty_grads(by_kernel, _inputs()), _penalty_grads(by_torch, _inputs())
    assert any(w.abs().max() > 1e-3 for w in want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
