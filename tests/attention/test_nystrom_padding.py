"""Padded keys count nowhere in the Nyström family and the exact Gaussian kernel: a NaN or Inf
in a padded key or value changes no output and no gradient, not even through a zero weight."""

import pytest
import torch

import kattn
from kattn.functional.nystrom import nystromformer_attention, nystromformer_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv

CASES = {
    "nystromformer": ("nystromformer", {"num_landmarks": 4}, {}),
    "nystromformer-exact": ("nystromformer", {"num_landmarks": 64}, {}),  # L <= m: softmax
    "nystromformer-conv": ("nystromformer", {"num_landmarks": 4, "conv_kernel_size": 5}, {}),
    "skyformer": ("skyformer", {"num_landmarks": 8}, {}),
    "gaussian": ("gaussian", {}, {}),
    "gaussian-causal": ("gaussian", {}, {"causal": True}),
}


def poison(x, mask, values):
    """``x (B, H, L, ·)`` with the padded positions of ``mask`` filled, in turn, by ``values``."""
    x = x.detach().clone()
    rows, cols = mask.nonzero(as_tuple=True)
    for i, (b, j) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        x[b, :, j] = values[i % len(values)]
    return x


PARAMS = [
    pytest.param(case, lq, id=f"{case}-{kind}")
    for case in CASES
    for lq, kind in ((30, "self"), (23, "cross"))
    if lq == 30 or not (CASES[case][2].get("causal") or "conv" in case)  # those need Lq == Lk
]


@pytest.mark.parametrize(("case", "lq"), PARAMS)
def test_non_finite_padded_keys_and_values_change_nothing(case, lq):
    name, options, call = CASES[case]
    torch.manual_seed(0)
    attn = kattn.build(name, head_dim=16, num_heads=2, **options).eval()
    attn.double()
    q, k, v = qkv(lq=lq, lk=30, h=2, d=16)
    mask = padding_mask(2, 30, (3, 9))
    bad = [float("nan"), float("inf"), -float("inf")]
    inputs = [x.clone().requires_grad_() for x in (q, poison(k, mask, bad), poison(v, mask, bad))]
    plain = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attn(*inputs, key_padding_mask=mask, **call)
    expected = attn(*plain, key_padding_mask=mask, **call)
    assert torch.isfinite(out).all()  # every position, padded queries included
    assert_close(out, expected)
    got, want = grads(out, *inputs), grads(expected, *plain)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, b)
    pad = mask[:, None, :, None]
    assert not got[1].masked_select(pad).any() and not got[2].masked_select(pad).any()


def test_nystromformer_functions_ignore_non_finite_padding():
    q, k, v = qkv(lq=24, d=16)
    mask = padding_mask(2, 24, (0, 9))  # the second sequence pads whole segments
    bad = [float("nan"), float("inf")]
    k_bad, v_bad = poison(k, mask, bad), poison(v, mask, bad)
    for fn in (nystromformer_attention, nystromformer_attention_reference):
        out = fn(q, k_bad, v_bad, 6, key_padding_mask=mask)
        assert torch.isfinite(out).all()
        assert_close(out, fn(q, k, v, 6, key_padding_mask=mask))
