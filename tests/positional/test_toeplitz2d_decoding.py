"""Decoding with the 2-D relative bias (``rpe="toeplitz2d"``) cell by cell in row-major order:
kernelized attention keeps every past feature and value and weighs them afresh at each step,
softmax with the bias reads the bias rows of each new cell; both equal the causal forward."""

import pytest
import torch

import kattn

from ..helpers import assert_close, grads, qkv, step_through

H, D, GRID = 3, 16, (3, 5)
CELLS = GRID[0] * GRID[1]


def build(name, seed=0, **options):
    torch.manual_seed(seed)
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=CELLS, grid=GRID, **options)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a bias far from 0, different for every (Δrow, Δcol) and head
        attn.rpe.bias.copy_(torch.randn(attn.rpe.bias.shape, generator=g) * 1.5)
    return attn.double().eval()


MECHANISMS = {
    "nprf_rpe-dense": ("nprf_rpe", {"rpe": "toeplitz2d", "rpe_method": "dense"}),
    "nprf_rpe-fft": ("nprf_rpe", {"rpe": "toeplitz2d", "rpe_method": "fft", "num_features": 24}),
    "softmax_rpe": ("softmax_rpe", {"rpe": "toeplitz2d"}),
}


@pytest.mark.parametrize("case", MECHANISMS)
def test_steps_equal_the_causal_forward(case):
    name, options = MECHANISMS[case]
    attn = build(name, **options)
    assert attn.supports_recurrent
    q, k, v = qkv(lq=CELLS, requires_grad=True)
    full = attn(q, k, v, causal=True)
    out, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=q.dtype))
    assert_close(out, full)
    # the bias's gradient flows through the steps as through the forward
    steps, forward = grads(out, q, k, v, attn.rpe.bias), grads(full, q, k, v, attn.rpe.bias)
    for a, b in zip(steps, forward, strict=True):
        assert_close(a, b)


def test_the_window_weighs_a_cell_by_the_current_column():
    """Cells 5 and 6 both have cell ``t − 1`` just before them, at Δ = (−1, +4) (5 starts a
    row) and at Δ = (0, −1): the window's coefficient of offset −1 is the bias at each."""
    rpe = build("nprf_rpe", rpe="toeplitz2d").rpe
    h, w = GRID
    for t, (dr, dc) in ((5, (-1, 4)), (6, (0, -1))):
        state = rpe.init_state(1, 4, device=None, dtype=torch.float64)
        state = state._replace(keys=torch.zeros(1, H, t, 4, dtype=torch.float64))
        log_coeff, left = rpe.decoding_window(state)
        assert left == CELLS and log_coeff.shape == (H, CELLS + 2)
        assert torch.equal(log_coeff[:, left - 1], rpe.bias[:, dr + h - 1, dc + w - 1])
        assert torch.equal(log_coeff[:, left], rpe.bias[:, h - 1, w - 1])  # the cell itself


@pytest.mark.parametrize("case", MECHANISMS)
def test_a_prompt_then_steps(case):
    name, options = MECHANISMS[case]
    attn = build(name, **options)
    q, k, v = qkv(lq=CELLS, seed=2)
    head, state = attn.prefill(q[:, :, :7], k[:, :, :7], v[:, :, :7])
    tail, _ = step_through(attn.step, q, k, v, state, start=7)
    assert_close(torch.cat([head, tail], dim=2), attn(q, k, v, causal=True))


@pytest.mark.parametrize("case", MECHANISMS)
def test_stepping_past_the_grid_is_refused(case):
    name, options = MECHANISMS[case]
    attn = build(name, **options)
    q, k, v = qkv(lq=CELLS + 1, seed=3)
    fresh = attn.init_state(2, H, dtype=q.dtype)
    _, state = step_through(attn.step, q[:, :, :CELLS], k[:, :, :CELLS], v[:, :, :CELLS], fresh)
    with pytest.raises(ValueError, match=r"position 15 is beyond the 3×5 grid"):
        attn.step(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], state)


def test_the_decoding_rows_are_rows_of_the_dense_bias():
    rpe = build("nprf_rpe", rpe="toeplitz2d").rpe
    dense = rpe.dense_log(CELLS, CELLS)
    assert torch.equal(rpe.decoding_rows(4, 6), dense[:, 4:10, :10])
    with pytest.raises(ValueError, match="beyond the 3×5 grid"):
        rpe.decoding_rows(10, 6)
