"""The positional Triton kernels at the default normaliser guard (1e-6 of the largest weight)
against the dense float64 truth: a part of the weights that has no keys for some query (the
far field before the first ``left`` queries, the future of the queries past the last key)
or whose keys are all padding must not be the unit in which the guard measures the
normaliser, even without key log-scales and with coefficients e^30 apart."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional.banded import banded_log_coefficients
from kattn.functional.decay import decay_log_coefficients
from kattn.functional.linear import linear_attention_reference
from kattn.functional.toeplitz import toeplitz_dense
from kattn.ops.triton.banded import banded_linear_attention_triton
from kattn.ops.triton.decay import decay_linear_attention_triton
from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton

from ..helpers import padding_mask
from .kernel_device import DEVICE, needs_kernels
from .rpe_kernel_inputs import assert_matches, kernel_inputs, on_cpu64

pytestmark = needs_kernels

H, LQ, LK = 2, 21, 13


def _truth(fq, fk, v, log_coeff, pad, causal):
    """The weighted mean over the keys each query sees, from the dense ``(Lq, Lk)``
    coefficients of ``log_coeff`` ``(H, Lq + Lk − 1)``, in float64 with no guard to bite."""
    lq, lk = fq.shape[2], fk.shape[2]
    coeff = toeplitz_dense(on_cpu64(log_coeff).exp(), lq, lk)
    return linear_attention_reference(
        *(on_cpu64(x) for x in (fq, fk, v)), causal=causal, key_padding_mask=on_cpu64(pad),
        coeff=coeff, eps=1e-300,
    )  # fmt: skip


def _decay(fq, fk, v, pad, causal):
    log_alpha = torch.zeros(H, 2, 2)
    log_alpha[:, 1] = 30.0  # the future side e^30 times the past
    log_alpha[:, 0, 0] = 30.0  # and a fast past term e^30 times the slow one: behind padding,
    log_gamma = torch.full((H, 2, 2), -0.3)  # only padded keys are near enough to set units
    log_gamma[:, 0, 0] = -5.0
    out = decay_linear_attention_triton(
        fq, fk, v, log_alpha, log_gamma, causal=causal, key_padding_mask=pad, chunk_size=16
    )
    lq, lk = fq.shape[2], fk.shape[2]
    return out, decay_log_coefficients(log_alpha.double(), log_gamma.double(), lq, lk)


def _banded(fq, fk, v, pad, causal):
    left = 4
    log_coeff = torch.zeros(H, left + 4)
    log_coeff[:, 0] = 30.0  # the far left e^30 times the band: no far key before query 4
    out = banded_linear_attention_triton(
        fq, fk, v, log_coeff, left, causal=causal, key_padding_mask=pad, chunk_size=16
    )
    return out, banded_log_coefficients(log_coeff.double(), left, fq.shape[2], fk.shape[2])


def _toeplitz(fq, fk, v, pad, causal):
    lq, lk = fq.shape[2], fk.shape[2]
    log_coeff = torch.zeros(H, lq + lk - 1)
    # offset 0 and the farthest future ones (padded keys alone, for the first queries of row
    # 1) e^30 heavier than the rest
    log_coeff[:, lq - 1] = 30.0
    log_coeff[:, lq - 1 + lk - 2 :] = 30.0
    out = toeplitz_linear_attention_triton(
        fq, fk, v, log_coeff, causal=causal, key_padding_mask=pad, block_size=16
    )
    return out, log_coeff.double()


@pytest.mark.parametrize(
    "kernel", [_decay, _banded, _toeplitz], ids=["decay", "banded", "toeplitz"]
)
@pytest.mark.parametrize(
    ("lq", "causal", "padded"),
    [(LQ, False, False), (LQ, False, True), (LK, True, True)],
    ids=["cross", "cross-padded", "causal-padded"],
)
def test_a_part_without_keys_sets_no_units_for_the_guard(kernel, lq, causal, padded) -> None:
    fq, fk, v, _ = kernel_inputs(2, H, lq, LK, 8, 4, seed=5)
    pad = padding_mask(2, LK, (0, 3)).to(DEVICE) if padded else None
    out, log_coeff = kernel(fq, fk, v, pad, causal)
    assert torch.isfinite(out).all()
    assert_matches(out, _truth(fq, fk, v, log_coeff, pad, causal))
