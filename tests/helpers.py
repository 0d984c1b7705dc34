"""Shared test helpers: one ``assert_close`` with tolerances per dtype, inputs, masks, and
decoding token by token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

TOLERANCES = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (1e-2, 1e-3),
}


def assert_close(actual: Tensor, expected: Tensor, dtype: torch.dtype | None = None) -> None:
    """``torch.testing.assert_close`` with the tolerances of ``dtype`` (default: actual's)."""
    rtol, atol = TOLERANCES[dtype or actual.dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol, atol=atol)


def qkv(
    b: int = 2,
    h: int = 3,
    lq: int = 37,
    lk: int | None = None,
    d: int = 16,
    dv: int = 8,
    *,
    scale: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    requires_grad: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random q ``(B, H, Lq, D)``, k ``(B, H, Lk, D)``, v ``(B, H, Lk, Dv)``."""
    lk = lq if lk is None else lk
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, lk, dv, generator=g, dtype=torch.float64)
    return tuple(x.to(dtype).requires_grad_(requires_grad) for x in (q, k, v))  # type: ignore[return-value]


def padding_mask(b: int, length: int, pads: tuple[int, ...], *, left: bool = False) -> Tensor:
    """``(B, L)`` bool mask, True on the last (or first) ``pads[b]`` positions of row b."""
    mask = torch.zeros(b, length, dtype=torch.bool)
    for row, p in enumerate(pads):
        if p:
            if left:
                mask[row, :p] = True
            else:
                mask[row, length - p :] = True
    return mask


def step_through(
    step: Callable[..., tuple[Tensor, Any]],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: Any,
    *,
    start: int = 0,
) -> tuple[Tensor, Any]:
    """Outputs of ``step`` on tokens ``start, ..., L - 1`` of q, k, v, one at a time from
    ``state``, concatenated along L, and the state after the last token.

    ``step`` is a module's ``step`` or a functional one: ``(q, k, v, state) -> (out, state)``
    on one token ``(B, H, 1, D)``.
    """
    outs = []
    for t in range(start, q.shape[2]):
        out, state = step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        outs.append(out)
    return torch.cat(outs, dim=2), state


def grads(out: Tensor, *inputs: Tensor, seed: int = 5) -> list[Tensor]:
    """Gradients of a fixed random projection of ``out`` with respect to ``inputs``."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    return list(torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True))


def assert_half_mostly_close(attn: torch.nn.Module, dtype: torch.dtype, heads: int) -> None:
    """``attn`` in ``dtype`` on padded inputs is finite and, where rounding did not change a
    discrete choice (a hash neighbour, a sampled top query: rows within 0.1 of the fp32
    output, at least 90% of them), as close to fp32 as ``dtype``'s tolerances."""
    q, k, v = (x.to(dtype) for x in qkv(2, heads, 70, scale=3.0))
    mask = padding_mask(2, 70, (0, 13))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn(q.float(), k.float(), v.float(), key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    keep = (out.float() - ref).abs().amax(-1) < 0.1
    assert keep.float().mean() > 0.9
    assert_close(out.float()[keep], ref[keep], dtype)
