"""The PyTorch banded path at the default normaliser guard (1e-6) against the dense float64
truth, where its shared units (the largest coefficient plus the largest key log-scale) lie
far above what some queries see: the guard is measured in each query's own units, so those
queries still get their exact weighted mean."""

import pytest
import torch

from kattn.functional import banded_linear_attention
from kattn.functional.banded import banded_log_coefficients
from kattn.functional.banded_decoding import banded_init_state, banded_step
from kattn.functional.linear import linear_attention_reference
from kattn.functional.toeplitz import toeplitz_dense

from ..helpers import assert_close, padding_mask

H = 2


def _truth(fq, fk, v, log_coeff, left, s, pad, causal):
    lq, lk = fq.shape[2], fk.shape[2]
    coeff = toeplitz_dense(banded_log_coefficients(log_coeff, left, lq, lk).exp(), lq, lk)
    keys = fk if s is None else fk * s.exp()[..., None]
    return linear_attention_reference(
        fq, keys, v, causal=causal, key_padding_mask=pad, coeff=coeff, eps=1e-300
    )


def _inputs(lq, lk, seed=0):
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(2, H, lq, 6, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(2, H, lk, 6, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(2, H, lk, 3, generator=g, dtype=torch.float64)
    return fq, fk, v


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "padded", "scaled"),
    [(21, 13, False, False, False), (21, 13, False, True, True), (24, 24, False, False, True),
     (24, 24, True, True, True), (24, 24, True, False, False)],
    ids=["cross", "cross-padded-scaled", "scaled", "causal-padded-scaled", "causal"],
)  # fmt: skip
def test_each_query_is_guarded_in_its_own_units(lq, lk, causal, padded, scaled):
    fq, fk, v = _inputs(lq, lk)
    left = 4
    log_coeff = torch.full((H, left + 5), -30.0, dtype=torch.float64)
    log_coeff[:, left] = 0.0  # offset 0 e^30 heavier than the rest
    log_coeff[:, 0] = 20.0  # and the far left heavier still, absent before query `left`
    s = None
    if scaled:  # the first key e^30 heavier than the others: the units of every row
        s = torch.zeros(2, H, lk, dtype=torch.float64)
        s[:, :, 0] = 30.0
    pad = padding_mask(2, lk, (0, 3)) if padded else None
    out = banded_linear_attention(
        fq, fk, v, log_coeff, left, causal=causal, k_log_scale=s, key_padding_mask=pad
    )
    assert_close(out, _truth(fq, fk, v, log_coeff, left, s, pad, causal))


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
def test_decoding_steps_are_guarded_in_each_tokens_own_units(scaled):
    """The decoding step sums in the same shared units as the causal path (the past's largest
    coefficient and the largest key log-scale so far), so it measures the guard the same way."""
    fq, fk, v = _inputs(24, 24)
    left = 4
    log_coeff = torch.full((H, left + 5), -30.0, dtype=torch.float64)
    log_coeff[:, left] = 0.0
    log_coeff[:, 0] = 20.0  # the far field, empty for the first `left` tokens
    s = torch.zeros(2, H, 24, dtype=torch.float64)
    if scaled:
        s[:, :, 0] = 30.0
    state = banded_init_state(2, H, 6, dtype=torch.float64)
    outs = []
    for t in range(24):
        one = slice(t, t + 1)
        out, state = banded_step(
            fq[:, :, one], fk[:, :, one], v[:, :, one], state, log_coeff, left,
            k_log_scale=s[:, :, one],
        )  # fmt: skip
        outs.append(out)
    truth = _truth(fq, fk, v, log_coeff, left, s if scaled else None, None, True)
    assert_close(torch.cat(outs, dim=2), truth)
