"""Decaying relative positions (``c = Σ_r α_r γ_r^{|j−i|}``): chunked recurrences and steps
against the dense reference."""

import math

import pytest
import torch

from kattn.functional.decay import (
    decay_init_state,
    decay_linear_attention,
    decay_log_coefficients,
    decay_prefill,
    decay_step,
)
from kattn.functional.linear import linear_attention_reference
from kattn.functional.linear_causal import causal_linear_sums
from kattn.functional.toeplitz import (
    toeplitz_dense,
)

from ..helpers import assert_close
from .rpe_helpers import (
    CASES,
    DV,
    EPS,
    IDS,
    B,
    H,
    M,
    _seeded,
    check,
    inputs,
    mask_for,
    reference,
    run_steps,
)

__all__ = ["_seeded"]


@pytest.mark.parametrize(("lq", "lk", "causal"), CASES, ids=IDS)
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_decay_equals_dense_reference(lq, lk, causal, chunk):
    fq, fk, v, s = inputs(lq, lk, seed=chunk)
    log_alpha = torch.randn(H, 2, 3, dtype=torch.float64).requires_grad_()
    log_gamma = (-torch.rand(H, 2, 3, dtype=torch.float64) - 0.01).requires_grad_()
    mask = mask_for(lk, (0, 3))
    out = decay_linear_attention(
        fq,
        fk,
        v,
        log_alpha,
        log_gamma,
        causal=causal,
        k_log_scale=s,
        key_padding_mask=mask,
        chunk_size=chunk,
        block_size=8,
        eps=EPS,
    )
    coeff = toeplitz_dense(decay_log_coefficients(log_alpha, log_gamma, lq, lk).exp(), lq, lk)
    check(
        out,
        reference(fq, fk, v, s, coeff, causal=causal, mask=mask),
        fq,
        fk,
        v,
        s,
        log_alpha,
        log_gamma,
    )


def test_decay_coefficients_are_sums_of_geometric_terms():
    log_alpha = torch.log(torch.tensor([[[0.5, 2.0], [1.0, 3.0]]], dtype=torch.float64))
    log_gamma = torch.log(torch.tensor([[[0.5, 0.9], [0.25, 0.8]]], dtype=torch.float64))
    c = decay_log_coefficients(log_alpha, log_gamma, 3, 3).exp()[0]  # offsets −2…2
    expected = [0.5 * 0.25 + 2 * 0.81, 0.5 * 0.5 + 2 * 0.9, 2.5, 0.25 + 3 * 0.8, 1 / 16 + 3 * 0.64]
    assert_close(c, torch.tensor(expected, dtype=torch.float64))


def test_decay_steps_equal_the_causal_forward():
    fq, fk, v, s = (x.detach() for x in inputs(23, 23, spread=4.0))
    log_alpha, log_gamma = torch.randn(H, 2, 2, dtype=torch.float64), -torch.rand(H, 2, 2)
    full = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, chunk_size=4, eps=EPS
    )
    state = decay_init_state(B, H, 2, M, dtype=torch.float64)
    steps = run_steps(decay_step, state, fq, fk, v, s, log_alpha=log_alpha, log_gamma=log_gamma)
    assert_close(steps, full)


def test_decay_step_and_prefill_refuse_parameters_of_two_shapes():
    fq, fk, v, _ = (x.detach() for x in inputs(3, 3, spread=4.0))
    log_alpha, log_gamma = torch.zeros(H, 2, 2), -torch.ones(H, 2, 3)
    state = decay_init_state(B, H, 3, M, dtype=torch.float64)
    with pytest.raises(ValueError, match="log_alpha and log_gamma must have one"):
        decay_step(fq[:, :, :1], fk[:, :, :1], v[:, :, :1], state, log_alpha, log_gamma)
    with pytest.raises(ValueError, match="log_alpha and log_gamma must have one"):
        decay_prefill(fq, fk, v, state, log_alpha, log_gamma)


def test_decay_offsets_follow_the_decay():
    """An early key far larger than the recent ones decays away; the recent keys must keep
    their relative weights (a non-decayed running maximum would floor them all alike)."""
    length, g = 300, torch.Generator().manual_seed(4)
    fq = torch.rand(1, 1, length, M, generator=g) + 0.05
    fk = torch.rand(1, 1, length, M, generator=g) + 0.05
    v = torch.randn(1, 1, length, DV, generator=g)
    s = torch.full((1, 1, length), -100.0)
    s[..., 0] = 0.0
    s[..., 1:] += torch.randn(length - 1, generator=g)
    log_alpha = torch.zeros(1, 2, 1)
    log_gamma = torch.full((1, 2, 1), math.log(0.75))
    out = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, chunk_size=16, eps=EPS
    )
    log_c = decay_log_coefficients(log_alpha.double(), log_gamma.double(), length, length)
    coeff = toeplitz_dense(log_c.exp(), length, length)
    fq64, fk64, v64, s64 = (x.double() for x in (fq, fk, v, s))
    # fp64 reference with a guard far below its tiny (about e^-85) normalisers
    ref = linear_attention_reference(
        fq64, fk64 * s64.exp()[..., None], v64, causal=True, coeff=coeff, eps=1e-300
    )
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    state = decay_init_state(1, 1, 1, M)
    steps = run_steps(decay_step, state, fq, fk, v, s, log_alpha=log_alpha, log_gamma=log_gamma)
    torch.testing.assert_close(steps.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("prompt", [7, 9, 12])
def test_decay_state_after_a_prompt_continues_exactly(prompt):
    """The state after a chunked prompt (length not a multiple of the chunk) continues with
    steps as if every token had been stepped."""
    fq, fk, v, s = (x.detach() for x in inputs(15, 15, spread=3.0))
    log_alpha, log_gamma = torch.randn(H, 2, 2, dtype=torch.float64), -torch.rand(H, 2, 2) - 0.1
    full = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, eps=EPS
    )
    rep = lambda x: x.unsqueeze(2).expand(B, H, 2, *x.shape[2:]).reshape(B, H * 2, *x.shape[2:])  # noqa: E731
    p = slice(0, prompt)
    _, _, _, state = causal_linear_sums(
        rep(fq[:, :, p]),
        rep(fk[:, :, p]),
        rep(v[:, :, p]),
        rep(s[:, :, p]),
        log_decay=log_gamma[:, 0].reshape(1, -1),
        chunk_size=4,
    )
    rest = slice(prompt, 15)
    steps = run_steps(
        decay_step,
        state,
        fq[:, :, rest],
        fk[:, :, rest],
        v[:, :, rest],
        s[:, :, rest],
        log_alpha=log_alpha,
        log_gamma=log_gamma,
    )
    assert_close(steps, full[:, :, rest])


@pytest.mark.parametrize(("lq", "lk", "causal"), [(13, 21, False), (21, 13, False), (17, 17, True)])
def test_decay_without_log_scales(lq, lk, causal):
    fq, fk, v, _ = inputs(lq, lk)
    log_alpha = torch.randn(H, 2, 2, dtype=torch.float64)
    log_gamma = -torch.rand(H, 2, 2, dtype=torch.float64) - 0.05
    mask = mask_for(lk, (2, 0))
    out = decay_linear_attention(
        fq, fk, v, log_alpha, log_gamma, causal=causal, key_padding_mask=mask, chunk_size=4, eps=EPS
    )
    coeff = toeplitz_dense(decay_log_coefficients(log_alpha, log_gamma, lq, lk).exp(), lq, lk)
    zero = torch.zeros(B, H, lk, dtype=torch.float64)
    check(out, reference(fq, fk, v, zero, coeff, causal=causal, mask=mask), fq, fk, v)


def test_decay_gradients_hold_where_the_normaliser_guard_holds():
    """Queries whose keys all lie many fast-decay steps away (Lq > Lk, γ = e^−2, e^−2.5): their
    normaliser falls under the guard eps, where the log-space shift of the terms no longer
    cancels; the gradients (the rates' included) still match finite differences of the
    forward, so the shift is differentiated, not detached."""
    g = torch.Generator().manual_seed(11)
    fq, fk, v, _ = inputs(30, 12)
    log_alpha = torch.randn(1, 2, 2, generator=g, dtype=torch.float64).expand(H, 2, 2)
    log_gamma = torch.tensor([-2.0, -2.5], dtype=torch.float64).expand(H, 2, 2).clone()
    mask = mask_for(12, (3, 0))

    def attend(log_alpha, log_gamma, v):
        return decay_linear_attention(
            fq, fk, v, log_alpha, log_gamma, key_padding_mask=mask, chunk_size=4
        )

    inputs_ = (log_alpha.clone().requires_grad_(), log_gamma.requires_grad_(), v.requires_grad_())
    assert torch.autograd.gradcheck(attend, inputs_, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True], ids=["fill", "padding"])
def test_a_side_without_keys_sets_no_units_for_the_guard(padded):
    """At the default guard (1e-6 of the largest weight), a side of the weights that has no
    keys for some query (the future of the queries past the last key, padding) must not be
    the unit in which the guard measures the normaliser: with future terms e^30 times the
    past's and no key log-scales, such queries still get the exact weighted mean."""
    fq, fk, v, _ = inputs(21, 13)
    log_alpha = torch.zeros(H, 2, 2, dtype=torch.float64)
    log_alpha[:, 1] = 30.0
    log_gamma = torch.full((H, 2, 2), -0.3, dtype=torch.float64)
    mask = mask_for(13, (0, 3)) if padded else None
    out = decay_linear_attention(fq, fk, v, log_alpha, log_gamma, key_padding_mask=mask)
    coeff = toeplitz_dense(decay_log_coefficients(log_alpha, log_gamma, 21, 13).exp(), 21, 13)
    no_scales = torch.zeros(fk.shape[:3], dtype=torch.float64)
    assert_close(out, reference(fq, fk, v, no_scales, coeff, causal=False, mask=mask))
