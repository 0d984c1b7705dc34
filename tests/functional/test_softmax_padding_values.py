"""Padded keys count nowhere in softmax attention: a NaN or an infinity stored at a padded
position of k or v changes no output and no gradient (not even through ``0 × NaN``)."""

import pytest
import torch

import kattn
from kattn.functional import softmax_attention, softmax_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv

B, H, L = 2, 3, 23
PADS = (6, 0)  # the second row has no padding: it must not change either


def module(q, k, v, *, causal, key_padding_mask):
    attn = kattn.build("softmax", head_dim=q.shape[-1], num_heads=q.shape[1])
    return attn(q, k, v, causal=causal, key_padding_mask=key_padding_mask)


PATHS = {
    "fast": softmax_attention,
    "reference": softmax_attention_reference,
    "module": module,
}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize("left", [False, True], ids=["right_pad", "left_pad"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("path", list(PATHS))
def test_non_finite_padded_keys_and_values_change_nothing(path, causal, left, bad):
    fn = PATHS[path]
    mask = padding_mask(B, L, PADS, left=left)
    where = mask[:, None, :].expand(B, H, L)  # (B, H, L): padded positions
    q, k, v = qkv(B, H, L, requires_grad=True)
    expected = fn(q, k, v, causal=causal, key_padding_mask=mask)
    expected_grads = grads(expected, q, k, v)
    k_bad, v_bad = (x.detach().clone() for x in (k, v))
    k_bad[where], v_bad[where] = bad, bad
    k_bad.requires_grad_(), v_bad.requires_grad_()
    out = fn(q, k_bad, v_bad, causal=causal, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert_close(out, expected)
    g_q, g_k, g_v = grads(out, q, k_bad, v_bad)
    assert all(torch.isfinite(g).all() for g in (g_q, g_k, g_v))
    assert_close(g_q, expected_grads[0])
    keep = ~where
    assert_close(g_k[keep], expected_grads[1][keep])
    assert_close(g_v[keep], expected_grads[2][keep])
