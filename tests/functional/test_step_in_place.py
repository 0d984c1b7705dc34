"""Decoding steps without a graph write into their state (as a key/value cache is written);
states that must not be written are copied, and ``DecodingState.clone`` branches."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import linear_attention_init_state, linear_attention_step
from kattn.functional.linear_causal import LinearState
from kattn.nn import CausalLM

B, H, M, DV = 2, 3, 8, 5


def _inputs(seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    fq, fk = (torch.rand(B, H, 1, M, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, 1, DV, generator=g, dtype=dtype)
    s = torch.randn(B, H, 1, generator=g, dtype=dtype)
    return fq, fk, v, s


def _state(steps: int) -> LinearState:
    state = linear_attention_init_state(B, H, M, DV, dtype=torch.float64)
    with torch.no_grad():
        for t in range(steps):
            fq, fk, v, s = _inputs(t)
            _, state = linear_attention_step(fq, fk, v, state, k_log_scale=s)
    return state


def _graph_step(state: LinearState, seed: int):
    """The same step through the differentiable path (nothing written in place)."""
    fq, fk, v, s = _inputs(seed)
    with torch.enable_grad():
        v = v.requires_grad_()
        out, new = linear_attention_step(fq, fk, v, state, k_log_scale=s)
    return out.detach(), LinearState(*(x.detach() for x in new))


@pytest.mark.parametrize("steps", [0, 3])
def test_a_step_without_graph_updates_the_state_in_place_and_equals_the_graph_step(steps):
    state = _state(steps)
    expected_out, expected = _graph_step(LinearState(*(x.clone() for x in state)), seed=7)
    fq, fk, v, s = _inputs(7)
    with torch.no_grad():
        out, new = linear_attention_step(fq, fk, v, state, k_log_scale=s)
    assert new.kv.data_ptr() == state.kv.data_ptr()  # written, not copied
    assert new.k_sum.data_ptr() == state.k_sum.data_ptr()
    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)
    for got, want in zip(new, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _leaf(state: LinearState) -> LinearState:
    return LinearState(state.kv.clone().requires_grad_(), state.k_sum, state.offset)


def _strided(state: LinearState) -> LinearState:
    kv = state.kv.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, not contiguous
    return LinearState(kv, state.k_sum, state.offset)


@pytest.mark.parametrize("make", [_leaf, _strided], ids=["leaf-requiring-grad", "strided"])
def test_states_that_must_not_be_written_are_copied(make):
    state = make(_state(3))
    before = [x.detach().clone() for x in state]
    expected_out, expected = _graph_step(LinearState(*(x.detach().clone() for x in state)), 7)
    fq, fk, v, s = _inputs(7)
    with torch.no_grad():
        out, new = linear_attention_step(fq, fk, v, state, k_log_scale=s)
    for x, old in zip(state, before, strict=True):
        assert torch.equal(x.detach(), old)
    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new.kv, expected.kv, rtol=1e-12, atol=1e-12)


def test_a_state_made_in_inference_mode_continues_under_no_grad():
    with torch.inference_mode():
        state = _state(3)
    expected_out, _ = _graph_step(LinearState(*(x.clone() for x in state)), seed=7)
    fq, fk, v, s = _inputs(7)
    with torch.no_grad():  # inference tensors cannot be written here: copied
        out, _ = linear_attention_step(fq, fk, v, state, k_log_scale=s)
    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "options"), [("performer", {}), ("softmax", {}), ("nprf_rpe", {"rpe": "decay"})]
)
def test_decoding_state_clone_lets_two_continuations_branch_from_one_prompt(name, options):
    torch.manual_seed(0)
    model = CausalLM(
        30, 64, dim=16, depth=2, num_heads=2, ffn_dim=32, dropout=0.0, mechanism=name, **options
    ).eval()
    tokens = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
    a, b = torch.tensor([3, 4]), torch.tensor([5, 6])
    with torch.inference_mode():
        _, state = model.prefill(tokens)
        branch = state.clone()
        got_a, _ = model.step(a, state)
        got_b, _ = model.step(b, branch)
        want_a = model(torch.cat([tokens, a[:, None]], dim=1))[:, -1]
        want_b = model(torch.cat([tokens, b[:, None]], dim=1))[:, -1]
    torch.testing.assert_close(got_a, want_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_b, want_b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got_a, got_b)


def test_clone_copies_every_tensor_of_every_layer():
    model = CausalLM(30, 64, dim=16, depth=2, num_heads=2, ffn_dim=32, mechanism="performer")
    with torch.no_grad():
        _, state = model.eval().prefill(torch.zeros(1, 4, dtype=torch.long))
    copy = state.clone()
    assert copy.position == state.position and type(copy.layers[0]) is type(state.layers[0])
    for mine, theirs in zip(copy.layers, state.layers, strict=True):
        for x, y in zip(mine, theirs, strict=True):
            assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
