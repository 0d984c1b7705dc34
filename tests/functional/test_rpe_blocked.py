"""The exact blocked path of relative-position weighted linear attention against the dense
``C ⊙ (φ(Q)φ(K)ᵀ)`` reference: forward, gradients (through the per-block recomputation),
causality and extreme log-scales."""

import pytest
import torch

import kattn
from kattn.functional.rpe_blocked import (
    DenseRows,
    ToeplitzRows,
    rpe_linear_attention_blocked,
)
from kattn.functional.toeplitz import toeplitz_dense
from kattn.functional.toeplitz2d import toeplitz2d_dense_log

from ..helpers import assert_close
from .rpe_helpers import CASES, EPS, IDS, H, _seeded, check, inputs, mask_for, reference

__all__ = ["_seeded"]

# one query per block, a few per block, everything in one block
BLOCKS = {"1row": 1, "3rows": 3 * 2 * 3 * 40, "whole": 1 << 20}


@pytest.mark.parametrize(("lq", "lk", "causal"), CASES, ids=IDS)
@pytest.mark.parametrize("pads", [None, (3, 0)], ids=["no_pad", "pad"])
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_blocked_equals_dense_reference(lq, lk, causal, pads, block, monkeypatch):
    from kattn.functional import rpe_blocked

    monkeypatch.setattr(rpe_blocked, "MIN_BLOCK_ROWS", 1)
    fq, fk, v, s = inputs(lq, lk)
    log_c = torch.randn(H, lq + lk - 1, dtype=torch.float64).requires_grad_()
    mask = mask_for(lk, pads)
    out = rpe_linear_attention_blocked(
        fq, fk, v, ToeplitzRows(log_c, lq), causal=causal, k_log_scale=s,
        key_padding_mask=mask, eps=EPS, max_block_elements=block,
    )  # fmt: skip
    coeff = toeplitz_dense(log_c.exp(), lq, lk)
    check(out, reference(fq, fk, v, s, coeff, causal=causal, mask=mask), fq, fk, v, s, log_c)


@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (5, 9), (9, 5), (12, 12)])
def test_toeplitz_rows_are_the_rows_of_the_dense_matrix(lq, lk):
    log_c = torch.randn(H, lq + lk - 1)
    full = toeplitz_dense(log_c, lq, lk)
    rows = ToeplitzRows(log_c, lq)
    for i0, i1 in [(0, lq), (0, 1), (lq - 1, lq), (lq // 3, lq // 3 + 2)]:
        i1 = min(i1, lq)
        for kv in {lk, max(1, lk // 2), 1}:
            assert torch.equal(rows(i0, i1, kv), full[:, i0:i1, :kv])


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("scaled", [True, False], ids=["log_scales", "no_log_scales"])
def test_blocked_with_two_dimensional_rows(monkeypatch, batch, scaled):
    # the rows are views of one matrix: a batch of 1 must not let a block overwrite them
    from kattn.functional import rpe_blocked

    monkeypatch.setattr(rpe_blocked, "MIN_BLOCK_ROWS", 1)
    grid = (3, 4)
    fq, fk, v, s = (x.detach()[:batch].requires_grad_() for x in inputs(12, 12))
    if not scaled:
        s = torch.zeros_like(s, requires_grad=True)
    log_b = torch.randn(H, 5, 7, dtype=torch.float64).requires_grad_()
    for causal in (False, True):
        log_dense = toeplitz2d_dense_log(log_b, grid)
        out = rpe_linear_attention_blocked(
            fq, fk, v, DenseRows(log_dense), causal=causal,
            k_log_scale=s if scaled else None, eps=EPS, max_block_elements=batch * 3 * 12 * 5,
        )  # fmt: skip
        coeff = toeplitz2d_dense_log(log_b, grid).exp()  # its own graph
        ref = reference(fq, fk, v, s, coeff, causal=causal, mask=None)
        check(out, ref, fq, fk, v, *([s] if scaled else []), log_b)


def test_causal_outputs_ignore_future_tokens_bitwise(monkeypatch):
    from kattn.functional import rpe_blocked

    monkeypatch.setattr(rpe_blocked, "MIN_BLOCK_ROWS", 1)
    length, cut = 30, 13
    fq, fk, v, s = (x.detach().float() for x in inputs(length, length))
    log_c = torch.randn(H, 2 * length - 1)
    changed = [x.clone() for x in (fq, fk, v, s)]
    for x in changed:
        x[:, :, cut:] = x[:, :, cut:] * 3.0 + 1.0  # the future: other values, larger scales
    for block in (1, 2 * 3 * 30 * 7, 1 << 20):
        a, b = (
            rpe_linear_attention_blocked(
                q,
                k,
                val,
                ToeplitzRows(log_c, length),
                causal=True,
                k_log_scale=sc,
                max_block_elements=block,
            )
            for q, k, val, sc in ((fq, fk, v, s), changed)
        )
        assert torch.equal(a[:, :, :cut], b[:, :, :cut])
        assert not torch.equal(a[:, :, cut:], b[:, :, cut:])


def test_extreme_log_scales_stay_finite_and_exact():
    # key log-scales spread over ±200 and coefficients over ±100: exp of either alone
    # overflows fp32, the per-row shift keeps every weight <= 1
    length = 24
    g = torch.Generator().manual_seed(3)
    fq = torch.rand(1, 2, length, 4, generator=g) + 0.1
    fk = torch.rand(1, 2, length, 4, generator=g) + 0.1
    v = torch.randn(1, 2, length, 3, generator=g)
    s = (torch.rand(1, 2, length, generator=g) - 0.5) * 400
    log_c = (torch.rand(2, 2 * length - 1, generator=g) - 0.5) * 200
    for causal in (False, True):
        out = rpe_linear_attention_blocked(
            fq, fk, v, ToeplitzRows(log_c, length), causal=causal, k_log_scale=s
        )
        log_w = toeplitz_dense(log_c.double(), length, length) + s.double()[:, :, None, :]
        if causal:
            log_w = log_w.masked_fill(torch.ones(length, length).triu(1).bool(), -torch.inf)
        w = torch.softmax(log_w, dim=-1) * (fq.double() @ fk.double().transpose(-1, -2))
        ref = (w @ v.double()) / w.sum(-1, keepdim=True)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_half_precision_inputs_give_finite_outputs_of_their_dtype():
    fq, fk, v, s = (x.detach() for x in inputs(33, 33))
    log_c = torch.randn(H, 65)
    out = rpe_linear_attention_blocked(
        fq.half(), fk.half(), v.half(), ToeplitzRows(log_c, 33), causal=True,
        k_log_scale=s.half() * 20,
    )  # fmt: skip
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_toeplitz_module_dense_method_matches_fft_in_training():
    # the module path: gradients of every parameter equal between the two methods
    torch.manual_seed(0)
    outs, grads = [], []
    for method in ("dense", "fft"):
        torch.manual_seed(0)
        attn = kattn.build(
            "nprf_rpe", head_dim=8, num_heads=2, max_len=40, num_features=16,
            rpe_method=method,
        ).double()  # fmt: skip
        with torch.no_grad():
            attn.rpe.bias.normal_()
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(2, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
        out = attn(q, k, v, causal=True)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append(attn.rpe.bias.grad.clone())
    assert_close(outs[0], outs[1])
    assert_close(grads[0], grads[1])


def test_second_derivatives_are_refused_clearly():
    fq, fk, v, s = inputs(6, 6)
    log_c = torch.randn(H, 11, dtype=torch.float64, requires_grad=True)
    out = rpe_linear_attention_blocked(fq, fk, v, ToeplitzRows(log_c, 6), k_log_scale=s)
    (g,) = torch.autograd.grad(out.square().sum(), fq, create_graph=True)
    with pytest.raises(RuntimeError, match=r"once_differentiable|marked with"):
        g.sum().backward()


def test_backward_inside_autocast_and_half_precision_coefficients():
    # backward may run inside an autocast region; a bf16 bias gets its gradient summed in fp32
    torch.manual_seed(0)
    attn = kattn.build(
        "nprf_rpe", head_dim=8, num_heads=2, max_len=200, num_features=16, rpe_method="dense"
    )
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 200, 8, generator=g, requires_grad=True) for _ in range(3))
    attn(q, k, v, causal=True).square().sum().backward()
    expected = attn.rpe.bias.grad.clone()
    attn.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(q, k, v, causal=True).square().sum().backward()
    torch.testing.assert_close(attn.rpe.bias.grad, expected)
    fq, fk, v64, s = inputs(200, 200)
    log_c = torch.randn(H, 399, dtype=torch.float64)
    grads = []
    for dtype in (torch.float64, torch.bfloat16):
        c = log_c.to(dtype).clone().requires_grad_()
        out = rpe_linear_attention_blocked(
            fq.detach(), fk.detach(), v64.detach(), ToeplitzRows(c, 200), causal=True,
            k_log_scale=s.detach(), max_block_elements=1,
        )  # fmt: skip
        out.square().sum().backward()
        grads.append(c.grad.double())
    # one bf16 rounding of the total, not one per block
    torch.testing.assert_close(grads[1], grads[0], rtol=8e-3, atol=1e-3 * grads[0].abs().max())


def test_no_queries_give_an_empty_output():
    fq, fk, v, _ = inputs(0, 5)
    out = rpe_linear_attention_blocked(fq, fk, v, ToeplitzRows(torch.zeros(H, 4), 0))
    assert out.shape == (fq.shape[0], H, 0, v.shape[-1])
