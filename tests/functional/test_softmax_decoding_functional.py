"""Softmax decoding in kattn.functional: a key/value cache, steps and prefill, against the causal
reference (forward and gradients)."""

import pytest
import torch

from kattn.functional import (
    KVCache,
    softmax_attention_reference,
    softmax_init_state,
    softmax_prefill,
    softmax_step,
)

from ..helpers import assert_close, grads, qkv


def decode(q, k, v, prompt, *, scale=None):
    """The prompt's first ``prompt`` tokens by prefill (none: steps only), then steps."""
    b, h, length, d = q.shape
    state = softmax_init_state(b, h, d, dtype=q.dtype)
    outs = []
    if prompt:
        out, state = softmax_prefill(
            q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], state, scale=scale
        )
        outs.append(out)
    for t in range(prompt, length):
        s = slice(t, t + 1)
        out, state = softmax_step(q[:, :, s], k[:, :, s], v[:, :, s], state, scale=scale)
        outs.append(out)
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("prompt", [0, 1, 7, 21], ids=lambda p: f"prompt{p}")
@pytest.mark.parametrize("scale", [None, 0.3])
def test_prefill_and_steps_equal_the_causal_reference(prompt, scale):
    q, k, v = qkv(2, 3, 21, d=8, dv=5, requires_grad=True)
    out, state = decode(q, k, v, prompt, scale=scale)
    ref = softmax_attention_reference(q, k, v, causal=True, scale=scale)
    assert_close(out, ref)
    for fast, slow in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(fast, slow)
    assert state.length == 21


def test_steps_without_gradients_write_into_a_growing_cache():
    q, k, v = qkv(1, 2, 40, d=4, dv=3)
    with torch.no_grad():
        out, state = decode(q, k, v, 0)
    assert_close(out, softmax_attention_reference(q, k, v, causal=True))
    assert isinstance(state, KVCache) and state.length == 40
    assert state.keys.shape[2] == 64  # capacity doubled from 16: 16, 32, 64
    torch.testing.assert_close(state.keys[:, :, :40], k, rtol=0, atol=0)


def test_a_foreign_or_mismatched_state_is_refused():
    q, k, v = qkv(2, 3, 1, d=4, dv=3)
    with pytest.raises(ValueError, match="KVCache"):
        softmax_step(q, k, v, (k, v, 0))
    with pytest.raises(ValueError, match="heads 3"):
        softmax_step(q, k, v, softmax_init_state(2, 4, 4, dtype=q.dtype))
