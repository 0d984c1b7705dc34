import pytest
import torch

import kattn
from kattn.functional import softmax_attention, softmax_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

CASES = [
    # (lq, lk, causal, pads)
    (37, 37, False, None),
    (37, 37, True, None),
    (13, 29, False, (3, 0)),
    (31, 31, False, (5, 11)),
    (31, 31, True, (5, 11)),
    (1, 1, True, None),
]


@pytest.mark.parametrize(("lq", "lk", "causal", "pads"), CASES)
def test_fast_equals_reference_forward_and_gradients(lq, lk, causal, pads):
    q, k, v = qkv(lq=lq, lk=lk, requires_grad=True)
    mask = None if pads is None else padding_mask(2, lk, pads)
    fast = softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    ref = softmax_attention_reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(fast, ref)
    for a, b in zip(grads(fast, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


def test_explicit_scale_is_used():
    q, k, v = qkv()
    assert_close(
        softmax_attention(q, k, v, scale=0.3), softmax_attention_reference(q, k, v, scale=0.3)
    )
    assert not torch.allclose(softmax_attention(q, k, v, scale=0.3), softmax_attention(q, k, v))


def test_fully_padded_rows_give_zeros_and_finite_gradients():
    q, k, v = qkv(requires_grad=True)
    mask = padding_mask(2, 37, (0, 37))
    out = softmax_attention(q, k, v, key_padding_mask=mask)
    assert torch.isfinite(out).all() and out[1].abs().max() == 0
    assert all(torch.isfinite(g).all() for g in grads(out, q, k, v))
    ref = softmax_attention_reference(q, k, v, key_padding_mask=mask)
    assert_close(out, ref)


def test_causal_with_left_padding_zeros_queries_that_see_nothing():
    q, k, v = qkv()
    mask = padding_mask(2, 37, (4, 0), left=True)
    out = softmax_attention(q, k, v, causal=True, key_padding_mask=mask)
    assert out[0, :, :4].abs().max() == 0
    assert_close(out, softmax_attention_reference(q, k, v, causal=True, key_padding_mask=mask))


def test_module_dropout_only_in_training():
    attn = kattn.build("softmax", head_dim=16, num_heads=3, dropout=0.5)
    q, k, v = qkv(dtype=torch.float32)
    attn.train()
    torch.manual_seed(0)
    a = attn(q, k, v)
    torch.manual_seed(1)
    assert not torch.allclose(a, attn(q, k, v))
    attn.eval()
    assert torch.equal(attn(q, k, v), attn(q, k, v))
    assert_close(attn(q, k, v), softmax_attention_reference(q, k, v))


def test_bad_dropout_and_scale_are_refused():
    with pytest.raises(ValueError, match="dropout"):
        kattn.build("softmax", head_dim=8, num_heads=1, dropout=1.0)
    with pytest.raises(ValueError, match="scale"):
        kattn.build("softmax", head_dim=8, num_heads=1, scale=0.0)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["cache_buffers", "differentiable"])
def test_key_value_cache_steps_equal_causal_forward(requires_grad):
    attn = kattn.build("softmax", head_dim=16, num_heads=3)
    q, k, v = qkv(lq=40, requires_grad=requires_grad)  # grows the cache 16 → 32 → 64
    full = softmax_attention_reference(q, k, v, causal=True)
    steps, state = step_through(attn.step, q, k, v, attn.init_state(2, 3, dtype=q.dtype))
    assert_close(steps, full)
    assert state.length == 40 and state.keys.shape[2] >= 40
    if requires_grad:
        for a, b in zip(grads(steps, q, k, v), grads(full, q, k, v), strict=True):
            assert_close(a, b)


def test_key_value_cache_checks_its_state():
    attn = kattn.build("softmax", head_dim=16, num_heads=3)
    q, k, v = qkv(lq=1)
    with pytest.raises(ValueError, match="KVCache"):
        attn.step(q, k, v, None)
    state = attn.init_state(1, 3)
    with pytest.raises(ValueError, match="batch"):
        attn.step(q, k, v, state)
