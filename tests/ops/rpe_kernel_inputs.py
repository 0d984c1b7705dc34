"""Inputs and comparisons shared by the tests of the relative-position Triton kernels: CPU
tensors in Triton's interpreter (CUDA tensors on a GPU), references in float64 on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from torch import Tensor

from .kernel_device import DEVICE


def kernel_inputs(
    b: int, h: int, lq: int, lk: int, m: int, dv: int, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Positive features ``(B, H, Lq, M)``, ``(B, H, Lk, M)`` (as PRF's), values and key
    log-scales ``(B, H, Lk)`` spread over several units, fp32 on :data:`DEVICE`."""
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(b, h, lq, m, generator=g) + 0.05
    fk = torch.rand(b, h, lk, m, generator=g) + 0.05
    v = torch.randn(b, h, lk, dv, generator=g)
    s = torch.randn(b, h, lk, generator=g) * 3.0
    return fq.to(DEVICE), fk.to(DEVICE), v.to(DEVICE), s.to(DEVICE)


def on_cpu64(x: Tensor | None) -> Tensor | None:
    """``x`` as a float64 CPU tensor, in the graph (masks keep their dtype)."""
    if x is None:
        return None
    return x.cpu().double() if x.is_floating_point() else x.cpu()


def assert_matches(out: Tensor, ref: Tensor, tol: float = 2e-5) -> None:
    """``out`` (any device, dtype) against the float64 reference."""
    torch.testing.assert_close(out.detach().cpu().double(), ref, rtol=tol, atol=tol)


def assert_same_gradients(
    kernel: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    inputs: list[Tensor],
    tol: float = 1e-4,
) -> None:
    """Gradients of a fixed projection of ``kernel(*inputs)`` equal those of
    ``reference(*inputs)`` in float64 for every input."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = kernel(*leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, leaves, weight.to(out.device, out.dtype))
    cpu = [x.detach().cpu().double().requires_grad_() for x in inputs]
    want = torch.autograd.grad(reference(*cpu), cpu, weight.double())
    assert len(got) == len(inputs)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.cpu().double(), b, rtol=tol, atol=tol)


def refusing_reference(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, kernel: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``kernel`` run with ``module.name``, the PyTorch path that its backward would recompute
    (looked up when the forward runs), made to raise: the gradients it gives are its own
    kernels'."""

    def refuse(*args: object, **kwargs: object) -> Tensor:
        raise AssertionError(f"the backward recomputed the PyTorch path ({name})")

    def run(*args: object, **kwargs: object) -> Tensor:
        with monkeypatch.context() as patched:
            patched.setattr(module, name, refuse)
            return kernel(*args, **kwargs)

    return run
