"""Mechanisms built twice, ``backend="triton"`` and ``backend="torch"``, with the same
parameters and random features, and the inputs and comparison their tests share (float64,
CPU tensors in Triton's interpreter, CUDA tensors on a GPU)."""

from __future__ import annotations

import torch
from torch import nn

import kattn

from .kernel_device import DEVICE

B, H, D, DV, L, LQ = 2, 2, 8, 5, 21, 13


def pair(name: str, **options) -> tuple[nn.Module, nn.Module]:
    """``name`` built with backend="triton" and "torch" in float64 on :data:`DEVICE`, in
    evaluation mode; the plain aggregator unless ``rpe`` is given, few features (the
    interpreter is slow)."""
    spec = kattn.spec(name)
    if spec.size_option:
        options.setdefault(spec.size_option, 16)
    options.setdefault("rpe", None)
    torch.manual_seed(0)
    fast = kattn.build(name, head_dim=D, num_heads=H, backend="triton", **options)
    slow = kattn.build(name, head_dim=D, num_heads=H, backend="torch", **options)
    fast, slow = fast.to(DEVICE, torch.float64), slow.to(DEVICE, torch.float64)
    slow.load_state_dict(fast.state_dict())
    return fast.eval(), slow.eval()


def inputs(lq: int = L, lk: int = L, *, dtype=torch.float64, device=DEVICE, seed: int = 3):
    """q ``(B, H, lq, D)``, k ``(B, H, lk, D)`` and v ``(B, H, lk, DV)``, standard normal."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, lk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, lk, DV, generator=g, dtype=torch.float64)
    return [x.to(device, dtype) for x in (q, k, v)]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a`` equals ``b`` to float64 rounding of a few sums."""
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def gradients(outs, modules, tensors) -> list[tuple[torch.Tensor | None, ...]]:
    """For each output and its module, the gradients of a fixed projection of the output with
    respect to ``tensors`` and then the module's parameters (None where one is unused)."""
    weight = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(1))
    return [
        torch.autograd.grad(
            (out * weight.to(out)).sum(), (*tensors, *module.parameters()), allow_unused=True
        )
        for out, module in zip(outs, modules, strict=True)
    ]


def close_gradients(got, want) -> None:
    """The same gradients (:func:`gradients`), unused ones on both sides."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            close(a, b)
