"""Kernelized attention with a 2-D relative positional encoding on an image grid, by 2-D FFT.

Tokens are the cells of an ``h×w`` grid in row-major order; the weight of key ``(r_j, c_j)``
for query ``(r_i, c_i)`` is ``exp(b[r_j − r_i, c_j − c_i])`` (one learnable scalar per
(Δrow, Δcol) and head, the 2-D relative bias of the Swin Transformer used by Luo et al. 2021 §4.4).
The matrix is block-Toeplitz with Toeplitz blocks, so it multiplies ``φ(K) ⊗ V`` by a 2-D FFT
of size about ``2h × 2w``. Causal order is the row-major order: the future is ``Δrow > 0`` or
``Δrow = 0, Δcol > 0``, a set of offsets, so causal attention zeroes those coefficients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .numerics import DEFAULT_EPS, guard_in_units, prepare_linear_inputs
from .rpe_blocked import RowLogCoefficients
from .rpe_units import imprecise_prefix, running_key_units, with_prefix
from .toeplitz import (
    DEFAULT_MAX_BLOCK_ELEMENTS,
    circulant_embedding,
    exact_causal,
    fft_length,
    in_fft_dtype,
    spectral_product,
    transformed_attention,
)


def future_offsets2d(grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """``(2h−1, 2w−1)`` bool: True where the offset points to a later cell (row-major)."""
    h, w = grid
    dr = torch.arange(-(h - 1), h, device=device)[:, None]
    dc = torch.arange(-(w - 1), w, device=device)[None, :]
    return (dr > 0) | ((dr == 0) & (dc > 0))


def toeplitz2d_dense_log(log_bias: Tensor, grid: tuple[int, int]) -> Tensor:
    """The ``(H, L, L)`` log-coefficients ``b[r_j − r_i, c_j − c_i]`` of ``L = h·w`` cells."""
    h, w = grid
    cells = torch.arange(h * w, device=log_bias.device)
    rows, cols = cells // w, cells % w
    dr = rows[None, :] - rows[:, None] + h - 1
    dc = cols[None, :] - cols[:, None] + w - 1
    return log_bias[:, dr, dc]


def rpe2d_linear_attention_fft(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_bias: Tensor,
    grid: tuple[int, int],
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
    fft_dtype: torch.dtype | None = None,
    convex: bool = False,
) -> Tensor:
    """Kernelized attention with a 2-D relative bias, by 2-D FFT.

    Args:
        phi_q: ``(B, H, L, M)``; phi_k: ``(B, H, L, M)`` scaled by ``exp(k_log_scale)``;
            v: ``(B, H, L, Dv)``; ``L = h·w`` cells in row-major order.
        log_bias: ``(H, 2h−1, 2w−1)``, entry ``[Δrow + h − 1, Δcol + w − 1]``.
        grid: ``(h, w)``.
        causal: each cell sees the cells before it in row-major order, itself included.
        key_padding_mask, eps, max_block_elements, fft_dtype, convex: as for the 1-D FFT path.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of ``v``.
    """
    h, w = grid
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    fq, fk, v32, s = in_fft_dtype(fq, fk, v32, s, causal, fft_dtype)
    b, heads, length, _ = fq.shape
    if length != h * w or fk.shape[2] != h * w:
        raise ValueError(
            f"2-D relative positions need Lq = Lk = h·w = {h * w} for grid {grid}, "
            f"got Lq={length}, Lk={fk.shape[2]}"
        )
    log_bias = log_bias_given = log_bias.to(fq.dtype)
    if causal:
        log_bias = log_bias.masked_fill(future_offsets2d(grid, log_bias.device), float("-inf"))
    coeff = torch.exp(log_bias - log_bias.detach().amax(dim=(-2, -1), keepdim=True))
    nh, nw = fft_length(2 * h - 1), fft_length(2 * w - 1)
    kernel = circulant_embedding(circulant_embedding(coeff, h, h, nh, dim=-2), w, w, nw, dim=-1)
    spectrum = torch.fft.rfft2(kernel, s=(nh, nw))  # (H, nh, nw//2+1)
    spectrum = spectrum.expand(b, heads, -1, -1).reshape(b * heads, 1, 1, nh, -1)

    def apply(x: Tensor, rows: slice) -> Tensor:
        grid_x = x.reshape(*x.shape[:-1], h, w)
        y = torch.fft.irfft2(
            spectral_product(torch.fft.rfft2(grid_x, s=(nh, nw)), spectrum[rows]), s=(nh, nw)
        )
        return y[..., :h, :w].reshape(x.shape)

    # causal: the sums are in units of the largest key log-scale of all; the guard is measured
    # in units of the keys so far, so that no future key sets it
    units = running_key_units(s) if causal and s is not None else None
    out = transformed_attention(
        fq, fk, v32, s, apply, nh * nw, eps=eps if units is None else guard_in_units(eps, units),
        convex=convex, key_padding_mask=key_padding_mask, max_block_elements=max_block_elements,
    )  # fmt: skip
    if units is not None and s is not None:  # (s: for the type checker)
        # cells whose keys so far lie far below the largest key: their round-off would scale
        # with a future key, so they are recomputed exactly (a prefix in row-major order)
        below, p = imprecise_prefix(units, fq.dtype)
        if p > 0:
            mask = None if key_padding_mask is None else key_padding_mask[:, :p]
            keep = (fq[:, :, :p], fk[:, :, :p], v32[:, :, :p], s[:, :, :p])
            rows = GridRows(log_bias_given, grid)
            out = with_prefix(out, below, exact_causal(*keep, rows, mask, eps, convex))
    return out.to(v.dtype)


class GridRows(RowLogCoefficients):
    """Rows of the 2-D relative bias ``b[r_j − r_i, c_j − c_i]`` of a log-bias ``(H, 2h−1,
    2w−1)`` for the cells of an ``h×w`` grid in row-major order, gathered block by block
    (nothing of size L² is formed)."""

    def __init__(self, log_bias: Tensor, grid: tuple[int, int]):
        super().__init__(log_bias)
        self.grid = grid

    def _offsets(self, i0: int, i1: int, kv: int, device: torch.device) -> Tensor:
        """``(r, kv)``: the flat index of ``(Δrow, Δcol)`` of queries i0..i1−1, keys < kv."""
        h, w = self.grid
        i = torch.arange(i0, i1, device=device)[:, None]
        j = torch.arange(kv, device=device)[None, :]
        return (j // w - i // w + h - 1) * (2 * w - 1) + (j % w - i % w + w - 1)

    def block(self, coeff: Tensor, i0: int, i1: int, kv: int) -> Tensor:
        return coeff.flatten(1)[:, self._offsets(i0, i1, kv, coeff.device)]

    def add_block_grad(self, grad_coeff: Tensor, grad: Tensor, i0: int, i1: int) -> None:
        flat = self._offsets(i0, i1, grad.shape[-1], grad.device).flatten()
        grad_coeff.view(grad_coeff.shape[0], -1).index_add_(1, flat, grad.flatten(1))
