"""Shared inputs, references and checks of the relative-position tests."""

import pytest
import torch

from kattn.functional.linear import linear_attention_reference

from ..helpers import assert_close, grads, padding_mask

B, H, M, DV = 2, 3, 5, 4
EPS = 1e-30  # positive features: the guard only catches a zero normaliser


@pytest.fixture(autouse=True)
def _seeded():
    """Coefficients drawn with the global generator are the same whatever the test order."""
    torch.manual_seed(1234)


def inputs(lq, lk, *, seed=0, spread=2.0):
    """float64 positive features, values and key log-scales, all requiring grad."""
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(B, H, lq, M, generator=g, dtype=torch.float64) + 0.05
    fk = torch.rand(B, H, lk, M, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(B, H, lk, DV, generator=g, dtype=torch.float64)
    s = torch.randn(B, H, lk, generator=g, dtype=torch.float64) * spread
    return [x.requires_grad_() for x in (fq, fk, v, s)]


def reference(fq, fk, v, s, coeff, *, causal, mask):
    return linear_attention_reference(
        fq,
        fk * torch.exp(s)[..., None],
        v,
        causal=causal,
        key_padding_mask=mask,
        coeff=coeff,
        eps=EPS,
    )


def check(fast, ref, *tensors):
    assert_close(fast, ref)
    for a, b in zip(grads(fast, *tensors), grads(ref, *tensors), strict=True):
        # FFT round-off is relative to the largest entry, not to each one
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * max(1.0, float(b.abs().max())))


CASES = [  # (Lq, Lk, causal)
    (1, 1, False),
    (1, 1, True),
    (17, 17, False),
    (17, 17, True),
    (40, 40, True),
    (13, 21, False),
    (21, 13, False),
]
IDS = [f"{lq}x{lk}{'-causal' if c else ''}" for lq, lk, c in CASES]


def mask_for(lk, pads):
    return None if pads is None else padding_mask(B, lk, tuple(min(p, lk - 1) for p in pads))


def run_steps(step, state, fq, fk, v, s, **kwargs):
    outs = []
    for t in range(fq.shape[2]):
        one = slice(t, t + 1)
        out, state = step(
            fq[:, :, one], fk[:, :, one], v[:, :, one], state, k_log_scale=s[:, :, one], **kwargs
        )
        outs.append(out)
    return torch.cat(outs, dim=2)
