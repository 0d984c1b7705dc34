"""Toeplitz relative positional encodings: one learnable scalar per offset (1-D) or per
(Δrow, Δcol) on an image grid (2-D)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..checks import is_positive_int
from ..functional.banded_decoding import BandedState
from ..functional.rpe_blocked import RowLogCoefficients
from ..functional.toeplitz import fft_length
from ..functional.toeplitz2d import (
    GridRows,
    rpe2d_linear_attention_fft,
    toeplitz2d_dense_log,
)
from ..registry import register_encoding
from .base import RelativePositionBias, WindowDecoding


class ToeplitzBias(WindowDecoding, RelativePositionBias):
    """``c_{j−i} = exp(b_{j−i})`` with one learnable ``b`` per head and offset (Luo et al.).

    ``bias`` has shape ``(H, 2·max_len − 1)``; offset ``j − i`` is at index
    ``j − i + max_len − 1``. Initialised to 0 (the attention starts as plain kernelized
    attention).

    Methods: ``"auto"`` (default: whichever of the two is predicted faster; on the CPU the
    blocked dense form up to long sequences, the sooner the fewer features), ``"fft"``
    (O(L log L·M·Dv), Algorithm 1) or ``"dense"`` (exact, O(L²·(M+Dv)) time, in blocks of
    queries: O(L) memory per block row). Decoding keeps
    every past token (like a key/value cache: O(t·(M + Dv)) for token t), up to ``max_len``.
    """

    needs_max_len = True
    methods = ("auto", "fft", "dense")

    def __init__(self, *, num_heads: int, max_len: int | None = None, method: str | None = None):
        super().__init__(num_heads=num_heads, max_len=max_len, method=method)
        assert self.max_len is not None
        self.bias = nn.Parameter(torch.zeros(num_heads, 2 * self.max_len - 1))

    def log_coefficients(self, lq: int, lk: int) -> Tensor:
        self.check_lengths(lq, lk)
        assert self.max_len is not None
        zero = self.max_len - 1
        return self.bias[:, zero - (lq - 1) : zero + lk]

    def decoding_window(self, state: BandedState) -> tuple[Tensor, int]:
        assert self.max_len is not None
        if isinstance(state, BandedState) and state.keys.shape[2] >= self.max_len:
            raise ValueError(
                f"position {state.keys.shape[2]} is beyond max_len={self.max_len} of the "
                f"relative positional encoding"
            )
        # a window of max_len tokens: every past token keeps its own coefficient
        past = self.bias[:, : self.max_len]  # offsets −(max_len−1)…0
        return torch.cat([past[:, :1], past, past[:, -1:]], dim=1), self.max_len  # −max_len…1


class Toeplitz2dBias(WindowDecoding, RelativePositionBias):
    """2-D relative bias on an ``h×w`` grid of tokens (row-major): ``exp(b[Δrow, Δcol])``.

    ``bias`` has shape ``(H, 2h − 1, 2w − 1)``, entry ``[Δrow + h − 1, Δcol + w − 1]``,
    initialised to 0. Sequences must have ``h·w`` tokens (no cross-attention). Methods:
    ``"auto"`` (as for ``ToeplitzBias``), ``"fft"`` (2-D FFT) or ``"dense"``. Causal order is
    row-major: each cell sees the cells before it, itself included.

    Decoding goes in that order, one cell at a time, up to the ``h·w``-th. The weight of a past
    cell j for cell t depends on both (on t's column as well as on ``t − j``: the cell before
    t is at ``Δcol = −1`` unless t starts a row), so no constant-size state sums the past:
    decoding keeps every past ``φ(k_j)`` and ``v_j`` (a window as long as the grid, like a
    key/value cache) and weighs them afresh at each step, O(t·(M + Dv)) time for cell t and
    O(h·w·(M + Dv)) memory at the end of the grid.
    """

    supports_cross = False
    methods = ("auto", "fft", "dense")

    def __init__(
        self,
        *,
        num_heads: int,
        grid: tuple[int, int] | None = None,
        max_len: int | None = None,
        method: str | None = None,
    ):
        super().__init__(num_heads=num_heads, max_len=max_len, method=method)
        if grid is None or len(tuple(grid)) != 2 or not all(is_positive_int(g) for g in grid):
            raise ValueError(f"toeplitz2d needs grid=(h, w), two positive ints; got {grid!r}")
        self.grid = (int(grid[0]), int(grid[1]))
        h, w = self.grid
        self.bias = nn.Parameter(torch.zeros(num_heads, 2 * h - 1, 2 * w - 1))

    def check_lengths(self, lq: int, lk: int) -> None:
        h, w = self.grid
        if lq != h * w or lk != h * w:
            raise ValueError(
                f"2-D relative positions on grid {self.grid} need Lq = Lk = {h * w}, "
                f"got Lq={lq}, Lk={lk}"
            )

    def dense_log(self, lq: int, lk: int) -> Tensor:
        self.check_lengths(lq, lk)
        return toeplitz2d_dense_log(self.bias, self.grid)

    def row_log_coefficients(self, lq: int, lk: int) -> RowLogCoefficients:
        self.check_lengths(lq, lk)
        return GridRows(self.bias, self.grid)

    def log_between(self, queries: Tensor, keys: Tensor) -> Tensor:
        """``(H, Q, K)``: ``b[r_j − r_i, c_j − c_i]`` of the cells ``queries (Q,)`` and
        ``keys (K,)`` (row-major indices on the grid)."""
        w = self.grid[1]
        dr = keys[None, :] // w - queries[:, None] // w + self.grid[0] - 1
        dc = keys[None, :] % w - queries[:, None] % w + w - 1
        return self.bias[:, dr, dc]

    def decoding_rows(self, start: int, length: int) -> Tensor:
        self.check_position(start + length - 1)
        cells = torch.arange(start + length, device=self.bias.device)
        return self.log_between(cells[start:], cells)

    def decoding_window(self, state: BandedState) -> tuple[Tensor, int]:
        cells = self.grid[0] * self.grid[1]
        t = state.keys.shape[2]  # the window covers the grid, so it holds every past cell
        self.check_position(t)
        # offsets −cells…1 from cell t; those before the first cell (never read as weights of
        # a key) repeat the first cell's, so that they stay finite in the window's shift
        keys = (t + torch.arange(-cells, 2, device=self.bias.device)).clamp(0, t)
        return self.log_between(keys.new_tensor([t]), keys)[:, 0], cells

    def check_position(self, t: int) -> None:
        """Raise ``ValueError`` when cell ``t`` (0-based, row-major) is beyond the grid."""
        h, w = self.grid
        if t >= h * w:
            raise ValueError(
                f"position {t} is beyond the {h}×{w} grid of the 2-D relative positional "
                f"encoding: decoding covers its {h * w} cells once, in row-major order"
            )

    def fft_points(self, lq: int, lk: int) -> int:
        h, w = self.grid
        return fft_length(2 * h - 1) * fft_length(2 * w - 1)

    def _attend_fft(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        return rpe2d_linear_attention_fft(phi_q, phi_k, v, self.bias, self.grid, **kwargs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, grid={self.grid}"


register_encoding("toeplitz", ToeplitzBias)
register_encoding("toeplitz2d", Toeplitz2dBias)
