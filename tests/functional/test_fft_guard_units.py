"""The FFT paths (Luo et al. 2021, Algorithm 1) where the units of their shared sums lie far
above what some queries see, at the default normaliser guard (1e-6), against the dense float64
truth: a heavy future key must not set an earlier query's guard or precision (causal), and a
heavy coefficient a query does not see must not set its guard."""

import pytest
import torch

from kattn.functional import toeplitz as toeplitz_module
from kattn.functional.linear import linear_attention_reference
from kattn.functional.rpe_blocked import DenseRows, rpe_linear_attention_blocked
from kattn.functional.rpe_units import sliding_max
from kattn.functional.toeplitz import rpe_linear_attention_fft, toeplitz_dense
from kattn.functional.toeplitz2d import (
    GridRows,
    rpe2d_linear_attention_fft,
    toeplitz2d_dense_log,
)

from ..helpers import assert_close, grads, padding_mask

B, H = 2, 2


def _inputs(length, seed=0):
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(B, H, length, 5, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(B, H, length, 5, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(B, H, length, 3, generator=g, dtype=torch.float64)
    return fq, fk, v


def _truth(fq, fk, v, coeff, s, causal, mask=None):
    keys = fk if s is None else fk * s.exp()[..., None]
    return linear_attention_reference(
        fq, keys, v, causal=causal, key_padding_mask=mask, coeff=coeff, eps=1e-300
    )


def _check(out, ref, *tensors):
    assert_close(out, ref)
    for a, b in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * max(1.0, float(b.abs().max())))


def _heavy_keys(length, where, nats):
    """Key log-scales 0 but ``nats`` at the positions ``where``, requiring grad."""
    s = torch.zeros(B, H, length, dtype=torch.float64)
    for t in where:
        s[:, :, t] = nats
    return s.requires_grad_()


@pytest.mark.parametrize("blocked", [True, False], ids=["exact-prefix", "fft-prefix"])
@pytest.mark.parametrize("padded", [False, True], ids=["", "padded"])
def test_causal_heavy_future_keys_set_no_earlier_query(monkeypatch, blocked, padded):
    """Keys e^20 and e^40 heavier than the first ones arrive later: the queries before them
    get their exact outputs and gradients (the prefix recomputed by FFT or exactly)."""
    monkeypatch.setattr(toeplitz_module, "prefer_blocked", lambda *a, **kw: blocked)
    fq, fk, v = (x.requires_grad_() for x in _inputs(30))
    s = _heavy_keys(30, [], 0.0)
    with torch.no_grad():
        s[:, :, 11:] += 20.0
        s[:, :, 23:] += 20.0
    log_c = torch.randn(H, 59, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    log_c.requires_grad_()
    mask = padding_mask(B, 30, (3, 0)) if padded else None
    out = rpe_linear_attention_fft(
        fq, fk, v, log_c, causal=True, k_log_scale=s, key_padding_mask=mask
    )
    coeff = toeplitz_dense(log_c.exp(), 30, 30)
    _check(out, _truth(fq, fk, v, coeff, s, True, mask), fq, fk, v, s, log_c)


def test_coefficients_growing_with_distance_take_a_bounded_number_of_ffts(monkeypatch):
    """Each query's own units lie 1 nat per position below the next one's: every prefix is
    all but a few queries, so the recompute stops after a bounded number of FFTs and finishes
    exactly in blocks."""
    monkeypatch.setattr(toeplitz_module, "prefer_blocked", lambda *a, **kw: False)
    ffts = []
    real = toeplitz_module._fft_attention
    monkeypatch.setattr(
        toeplitz_module, "_fft_attention", lambda *a, **kw: ffts.append(1) or real(*a, **kw)
    )
    fq, fk, v = (x.requires_grad_() for x in _inputs(40))
    log_c = (-torch.arange(-39.0, 40.0, dtype=torch.float64).clamp_max(0.0)).repeat(H, 1)
    log_c.requires_grad_()
    out = rpe_linear_attention_fft(fq, fk, v, log_c, causal=True)
    assert len(ffts) == 1 + toeplitz_module._FFT_PREFIXES
    coeff = toeplitz_dense(log_c.exp(), 40, 40)
    _check(out, _truth(fq, fk, v, coeff, None, True), fq, fk, v, log_c)


def test_causal_outputs_do_not_move_with_a_future_key():
    fq, fk, v = _inputs(24)
    log_c = torch.randn(H, 47, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    light, heavy = _heavy_keys(24, [23], 0.0), _heavy_keys(24, [23], 35.0)
    a, b = (
        rpe_linear_attention_fft(fq, fk, v, log_c, causal=True, k_log_scale=s)
        for s in (light, heavy)
    )
    torch.testing.assert_close(a[:, :, :23], b[:, :, :23], rtol=1e-12, atol=1e-14)


def test_a_heavy_coefficient_out_of_sight_sets_no_causal_guard():
    """The offset −(L−1) is e^20 heavier than the rest: only the last query sees it, the
    others are recomputed without it."""
    fq, fk, v = (x.requires_grad_() for x in _inputs(24))
    log_c = torch.zeros(H, 47, dtype=torch.float64)
    log_c[:, 0] = 20.0
    log_c.requires_grad_()
    out = rpe_linear_attention_fft(fq, fk, v, log_c, causal=True)
    coeff = toeplitz_dense(log_c.exp(), 24, 24)
    _check(out, _truth(fq, fk, v, coeff, None, True), fq, fk, v, log_c)


#: non-causal sums keep one set of units, so their round-off scales with the largest
#: coefficient: e^18 × 1e-16 relative for queries that do not see it
_ROUNDED = {"rtol": 1e-6, "atol": 1e-7}


@pytest.mark.parametrize(("lq", "lk"), [(24, 24), (13, 21), (21, 13)])
def test_a_heavy_coefficient_out_of_sight_sets_no_guard(lq, lk):
    """Offsets at both ends are e^18 heavier than the rest: the queries that do not see them
    sum to about 1e-7 in the shared units, below the guard, yet get their mean."""
    g = torch.Generator().manual_seed(3)
    fq = torch.rand(B, H, lq, 5, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(B, H, lk, 5, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(B, H, lk, 3, generator=g, dtype=torch.float64)
    log_c = torch.randn(H, lq + lk - 1, generator=g, dtype=torch.float64)
    log_c[:, :3] += 18.0
    log_c[:, -3:] += 18.0
    out = rpe_linear_attention_fft(fq, fk, v, log_c)
    truth = _truth(fq, fk, v, toeplitz_dense(log_c.exp(), lq, lk), None, False)
    torch.testing.assert_close(out, truth, **_ROUNDED)


def test_2d_causal_heavy_future_keys_set_no_earlier_cell():
    grid, length = (4, 5), 20
    fq, fk, v = (x.requires_grad_() for x in _inputs(length))
    s = _heavy_keys(length, [], 0.0)
    with torch.no_grad():
        s[:, :, 17:] += 30.0
    log_b = torch.randn(H, 7, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    log_b.requires_grad_()
    out = rpe2d_linear_attention_fft(fq, fk, v, log_b, grid, causal=True, k_log_scale=s)
    coeff = toeplitz2d_dense_log(log_b, grid).exp()
    _check(out, _truth(fq, fk, v, coeff, s, True), fq, fk, v, s, log_b)


@pytest.mark.parametrize("width", [1, 3, 7, 10])
def test_sliding_max_equals_the_windows_maxima(width):
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(sliding_max(x, width), x.unfold(-1, width, 1).amax(dim=-1))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grid_rows_equal_the_dense_bias(causal):
    """The 2-D bias gathered block by block equals its dense matrix, values and gradients."""
    grid, length = (6, 7), 42  # two blocks of queries (at least 32 each)
    fq, fk, v = (x.requires_grad_() for x in _inputs(length))
    g = torch.Generator().manual_seed(6)
    log_b = torch.randn(H, 11, 13, dtype=torch.float64, generator=g).requires_grad_()
    run = {"causal": causal, "max_block_elements": 1}
    out = rpe_linear_attention_blocked(fq, fk, v, GridRows(log_b, grid), **run)
    dense = DenseRows(toeplitz2d_dense_log(log_b, grid))
    _check(out, rpe_linear_attention_blocked(fq, fk, v, dense, **run), fq, fk, v, log_b)
