"""``Attention.prefill``: a prompt read in parallel form gives the causal forward's outputs and a
state from which ``step`` (or another prefill) continues exactly, for every recurrent mechanism."""

from __future__ import annotations

import pytest
import torch

import kattn

from ..helpers import assert_close, qkv, step_through

#: every registered mechanism with a recurrent form, plus the relative encodings of nprf_rpe
CASES = [
    (name, {})
    for name in kattn.available()
    if kattn.build(name, head_dim=8, num_heads=2, max_len=64).supports_recurrent
] + [("nprf_rpe", {"rpe": "decay"}), ("nprf_rpe", {"rpe": "bucketed"})]


def _build(name: str, options: dict) -> kattn.Attention:
    torch.manual_seed(0)
    return kattn.build(name, head_dim=8, num_heads=2, max_len=64, **options).double().eval()


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}{o}" for n, o in CASES])
def test_prefill_then_steps_equal_the_causal_forward(name, options):
    attn = _build(name, options)
    q, k, v = qkv(2, 2, 29, d=8, dv=8)
    expected = attn(q, k, v, causal=True)
    first, state = attn.prefill(q[:, :, :13], k[:, :, :13], v[:, :, :13])
    second, state = attn.prefill(q[:, :, 13:21], k[:, :, 13:21], v[:, :, 13:21], state)
    rest, _ = step_through(attn.step, q, k, v, state, start=21)
    assert_close(torch.cat([first, second, rest], dim=2), expected)


@pytest.mark.parametrize("name", ["performer", "softmax", "simpletron"])
def test_prefill_of_nothing_is_refused(name):
    attn = _build(name, {})
    q, k, v = qkv(1, 2, 5, d=8, dv=8)
    _, state = attn.prefill(q, k, v)
    with pytest.raises(ValueError, match="at least one position"):
        attn.prefill(q[:, :, :0], k[:, :, :0], v[:, :, :0], state)


def test_prefill_needs_a_recurrent_form():
    attn = kattn.build("gaussian", head_dim=8, num_heads=2, max_len=64)
    q, k, v = qkv(1, 2, 5, d=8, dv=8)
    with pytest.raises(NotImplementedError, match="no recurrent form"):
        attn.prefill(q, k, v)


def test_softmax_prefill_rejects_a_foreign_state():
    attn = _build("softmax", {})
    q, k, v = qkv(1, 2, 5, d=8, dv=8)
    with pytest.raises(ValueError, match="KVCache"):
        attn.prefill(q, k, v, state=("not", "a", "cache"))
