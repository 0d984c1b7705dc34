"""The fast Walsh–Hadamard transform: ``H x`` in O(D log D) without forming the D×D matrix.

``H`` is the unnormalised Sylvester–Hadamard matrix of order D (a power of two):
``H_1 = [1]``, ``H_2n = [[H_n, H_n], [H_n, −H_n]]``; entries ±1, symmetric, ``H H = D·I``.
FastFood (Le et al., ICML 2013; KL-Transformer eq. 6) applies it twice per block of frequencies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def is_power_of_two(n: int) -> bool:
    """Whether ``n`` is 1, 2, 4, 8, …"""
    return n >= 1 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    """The smallest power of two ``>= n`` (n >= 1)."""
    return 1 << max(0, n - 1).bit_length()


def hadamard_transform(x: Tensor, *, normalized: bool = False) -> Tensor:
    """``x Hᵀ = x H`` along the last dim: log₂ D butterfly stages ``(a, b) → (a + b, a − b)``.

    Args:
        x: ``(..., D)`` with D a power of two.
        normalized: divide by √D (then the transform is orthogonal and its own inverse).

    Returns:
        ``(..., D)``, differentiable (the backward is the same transform: H is symmetric).
    """
    n = x.shape[-1]
    if not is_power_of_two(n):
        raise ValueError(
            f"the last dim of x must be a power of two for the Walsh–Hadamard transform, got "
            f"{n}: pad it with zeros (kattn.functional.next_power_of_two gives the size)"
        )
    out = _Hadamard.apply(x)
    return out * n**-0.5 if normalized else out


def hadamard_matrix(n: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """The explicit ``(n, n)`` Sylvester–Hadamard matrix (reference and tests; O(n²))."""
    if not is_power_of_two(n):
        raise ValueError(f"n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def _butterflies(x: Tensor) -> Tensor:
    n = x.shape[-1]
    y = x.reshape(-1, n)
    half = 1
    while half < n:
        pairs = y.view(-1, n // (2 * half), 2, half)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).view(-1, n)
        half *= 2
    return y.view(x.shape) if x.is_contiguous() else y.reshape(x.shape)


class _Hadamard(torch.autograd.Function):
    """H is linear and symmetric: nothing is saved, the gradient is ``H`` of the gradient."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return _butterflies(x.contiguous())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _Hadamard.apply(grad)
