"""Linformer's attention in kattn.functional against its explicit reference."""

import pytest
import torch

import kattn
from kattn.functional import linformer_attention, linformer_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv


def projections(heads, rows, length, *, shared_kv=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(heads, rows, length, generator=g, dtype=torch.float64) / rows**0.5
    f = e if shared_kv else torch.randn(heads, rows, length, generator=g, dtype=torch.float64)
    return e.requires_grad_(), (e if shared_kv else f.requires_grad_())


@pytest.mark.parametrize(
    "lq, lk, pads, heads, shared_kv",
    [
        (17, 17, None, 3, False),
        (17, 17, (0, 5), 3, True),
        (9, 23, (6, 0), 1, False),
        (23, 9, None, 1, True),
    ],
    ids=["per-head", "padded-shared-kv", "cross-padded-one-for-all-heads", "cross-shared"],
)
def test_linformer_attention_equals_its_reference(lq, lk, pads, heads, shared_kv):
    q, k, v = qkv(2, 3, lq, lk, d=8, dv=5, requires_grad=True)
    e, f = projections(heads, 4, lk, shared_kv=shared_kv)
    mask = None if pads is None else padding_mask(2, lk, pads)
    out = linformer_attention(q, k, v, e, f, key_padding_mask=mask)
    ref = linformer_attention_reference(q, k, v, e, f, key_padding_mask=mask)
    assert out.shape == (2, 3, lq, 5)
    assert_close(out, ref)
    inputs = (q, k, v, e) if shared_kv else (q, k, v, e, f)
    for fast, slow in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(fast, slow)


def test_padded_keys_count_nothing_not_even_a_nan():
    q, k, v = qkv(2, 3, 11, d=8, dv=4)
    e, f = projections(3, 4, 11)
    mask = padding_mask(2, 11, (3, 0))
    pad = mask[:, None, :, None]
    k_nan, v_nan = k.masked_fill(pad, float("nan")), v.masked_fill(pad, float("nan"))
    for fn in (linformer_attention, linformer_attention_reference):
        clean = fn(q, k, v, e, f, key_padding_mask=mask)
        assert torch.equal(fn(q, k_nan, v_nan, e, f, key_padding_mask=mask), clean)


@pytest.mark.parametrize(
    "e_shape, f_shape",
    [((3, 4, 10), (3, 4, 11)), ((2, 4, 11), (2, 4, 11)), ((3, 4, 11), (3, 5, 11))],
)
def test_projections_that_do_not_fit_are_refused(e_shape, f_shape):
    q, k, v = qkv(1, 3, 11, d=8, dv=4)
    e, f = torch.ones(e_shape, dtype=torch.float64), torch.ones(f_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match="must"):
        linformer_attention(q, k, v, e, f)


def test_the_module_uses_the_functions():
    attn = kattn.build("linformer", head_dim=8, num_heads=3, max_len=32, proj_dim=4, share_kv=False)
    attn = attn.double()
    q, k, v = qkv(2, 3, 20, d=8, dv=8)
    mask = padding_mask(2, 20, (0, 4))
    e, f = attn.projection[:, 0, :, :20], attn.projection[:, 1, :, :20]
    assert torch.equal(
        attn(q, k, v, key_padding_mask=mask),
        linformer_attention(q, k, v, e, f, key_padding_mask=mask),
    )
    assert torch.equal(
        attn.reference(q, k, v, key_padding_mask=mask),
        linformer_attention_reference(q, k, v, e, f, key_padding_mask=mask),
    )
