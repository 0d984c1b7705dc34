"""Blocked local attention (whole blocks of ``window`` tokens) and the parallel prefill of both
local variants: the pattern against one written block by block, the block-sparse path against
the dense reference (forward and gradients), the prefill against token-by-token steps and the
causal forward from any state, and lucidrains' ``local-attention`` on the same inputs when it
is importable."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import (
    LocalState,
    local_attention,
    local_blocked_attention,
    local_blocked_pattern,
    local_init_state,
    local_prefill,
    local_step,
    sparse_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

#: (window, look_backward, look_forward, causal, L): lengths the window does not divide,
#: L < window, no neighbours (the LRA code's block-diagonal form), several blocks each way.
BLOCKED = [
    (4, 1, 1, False, 16),
    (4, 1, 1, True, 18),
    (5, 2, 0, False, 23),
    (5, 1, 2, False, 23),
    (3, 0, 0, False, 14),
    (3, 0, 0, True, 14),
    (7, 2, 1, True, 30),
    (8, 1, 1, False, 5),
    (8, 3, 0, True, 5),
    (1, 2, 3, False, 9),
    (6, 1, 1, False, 1),
]


def _expected_blocked(length: int, window: int, back: int, fwd: int, causal: bool) -> torch.Tensor:
    """The pattern written block by block, independently of local_blocked_pattern: query
    block n reads the key slice from the start of block n − back to the end of block n + fwd
    (to the query itself when causal), clipped to the sequence."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        n = i // window
        start = max(0, (n - back) * window)
        stop = i + 1 if causal else min(length, (n + fwd + 1) * window)
        allowed[i, start:stop] = True
    return allowed


@pytest.mark.parametrize(("window", "back", "fwd", "causal", "length"), BLOCKED)
def test_blocked_pattern_is_whole_blocks(window, back, fwd, causal, length):
    expected = _expected_blocked(length, window, back, fwd, causal)
    pattern = local_blocked_pattern(length, length, window, back, fwd, causal)
    assert torch.equal(pattern, expected)


@pytest.mark.parametrize(("window", "back", "fwd", "causal", "length"), BLOCKED)
@pytest.mark.parametrize("block_size", [None, 3, 16])
def test_blocked_forward_and_gradients_equal_the_reference(
    window, back, fwd, causal, length, block_size
):
    q, k, v = qkv(2, 3, length, requires_grad=True)
    out = local_blocked_attention(
        q,
        k,
        v,
        window=window,
        look_backward=back,
        look_forward=fwd,
        causal=causal,
        block_size=block_size,
    )
    allowed = _expected_blocked(length, window, back, fwd, causal)
    ref = sparse_attention_reference(q, k, v, allowed)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_blocked_defaults_are_one_block_back_and_one_forward():
    q, k, v = qkv(1, 2, 21)
    for causal, fwd in ((False, 1), (True, 0)):
        out = local_blocked_attention(q, k, v, window=4, causal=causal)
        ref = sparse_attention_reference(q, k, v, _expected_blocked(21, 4, 1, fwd, causal))
        assert_close(out, ref)


def test_blocked_padded_keys_count_nowhere():
    q, k, v = qkv(2, 3, 22)
    mask = padding_mask(2, 22, (0, 7))
    out = local_blocked_attention(q, k, v, window=4, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 15:] = float("nan")
    v2[1, :, 15:] = float("inf")
    assert_close(local_blocked_attention(q, k2, v2, window=4, key_padding_mask=mask), out)
    allowed = _expected_blocked(22, 4, 1, 1, False)
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask)
    assert_close(out, ref)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 0}, "window"),
        ({"window": 4, "look_backward": -1}, "look_backward"),
        ({"window": 4, "look_forward": -1}, "look_forward"),
        ({"window": 4, "block_size": 0}, "block_size"),
    ],
)
def test_blocked_bad_arguments_raise_naming_them(kwargs, name):
    q, k, v = qkv(1, 2, 5)
    with pytest.raises(ValueError, match=name):
        local_blocked_attention(q, k, v, **kwargs)
    if name != "block_size":
        with pytest.raises(ValueError, match=name):
            local_blocked_pattern(5, 5, **kwargs)


# ------------------------------------------------------------------------------ prefill

#: (name, window, look_backward): the band (window 1, look_backward keys) and blocked forms.
DECODERS = [("band", 1, 0), ("band", 1, 4), ("blocked", 3, 1), ("blocked", 4, 2), ("blocked", 5, 0)]


def _causal_forward(q, k, v, window, back):
    if window == 1:
        return local_attention(q, k, v, look_backward=back, look_forward=0, causal=True)
    return local_blocked_attention(q, k, v, window=window, look_backward=back, causal=True)


def _steps(q, k, v, state):
    return step_through(local_step, q, k, v, state)


def _assert_same_state(a: LocalState, b: LocalState) -> None:
    assert (a.length, a.window) == (b.length, b.window)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize(("form", "window", "back"), DECODERS)
def test_prefill_from_a_fresh_state_equals_steps_and_the_causal_forward(form, window, back):
    q, k, v = qkv(2, 3, 26)
    fresh = local_init_state(2, 3, 16, back, window=window, dtype=torch.float64)
    expected = _causal_forward(q, k, v, window, back)
    out, state = local_prefill(q, k, v, fresh)
    stepped, stepped_state = _steps(q, k, v, fresh)
    assert_close(out, expected)
    assert_close(stepped, expected)
    _assert_same_state(state, stepped_state)
    assert state.keys.shape[2] == (back + 1) * window  # the ring buffer, not the context


@pytest.mark.parametrize(("form", "window", "back"), DECODERS)
@pytest.mark.parametrize("cuts", [(3,), (1, 2), (13,), (2, 11), (1,), (25,)], ids=str)
def test_prefill_mid_sequence_equals_steps_and_the_causal_forward(form, window, back, cuts):
    """Whatever came before (steps, prefills shorter or longer than the ring buffer), the
    next prefill continues the sequence exactly."""
    q, k, v = qkv(2, 3, 26, seed=1)
    expected = _causal_forward(q, k, v, window, back)
    state = local_init_state(2, 3, 16, back, window=window, dtype=torch.float64)
    outs, start = [], 0
    for n, cut in enumerate(cuts):
        chunk = (q[:, :, start:cut], k[:, :, start:cut], v[:, :, start:cut])
        out, state = (_steps if n % 2 else local_prefill)(*chunk, state)  # type: ignore[operator]
        outs.append(out)
        start = cut
    out, state = local_prefill(q[:, :, start:], k[:, :, start:], v[:, :, start:], state)
    assert_close(torch.cat([*outs, out], dim=2), expected)
    fresh = local_init_state(2, 3, 16, back, window=window, dtype=torch.float64)
    _assert_same_state(state, _steps(q, k, v, fresh)[1])


def test_prefill_gradients_equal_the_causal_forward():
    q, k, v = qkv(1, 2, 17, requires_grad=True)
    state = local_init_state(1, 2, 16, 1, window=3, dtype=torch.float64)
    first, state = local_prefill(q[:, :, :7], k[:, :, :7], v[:, :, :7], state)
    second, _ = local_prefill(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], state)
    out = torch.cat([first, second], dim=2)
    expected = _causal_forward(q, k, v, 3, 1)
    for g, g_ref in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_prefill_refuses_bad_input():
    state = local_init_state(1, 2, 4, 1, window=3, dtype=torch.float64)
    q, k, v = qkv(1, 2, 5, d=4, dv=4)
    with pytest.raises(ValueError, match="L=0"):
        local_prefill(q[:, :, :0], k[:, :, :0], v[:, :, :0], state)
    with pytest.raises(ValueError, match="q and k"):
        local_prefill(q, k[:, :, :4], v, state)
    with pytest.raises(ValueError, match=r"state\.window"):
        local_prefill(q, k, v, state._replace(window=4))


# --------------------------------------------------------- lucidrains' local-attention

#: (window, look_backward, look_forward, causal, L); None: its default (1, or 0 causal).
LUCIDRAINS = [
    (4, 1, None, False, 16),
    (4, 1, None, True, 16),
    (5, 2, 0, False, 23),
    (5, 1, None, True, 23),
    (3, 0, 2, False, 14),
    (6, 0, 0, False, 20),
    (2, 3, 1, False, 11),
]


def _lucidrains(window, back, fwd, causal, length, **options):
    """lucidrains' LocalAttention (skipped when not importable), padded to whole blocks
    when the window does not divide the length, with no rotary or xpos embedding."""
    module = pytest.importorskip("local_attention")
    attn = module.LocalAttention(
        window_size=window,
        causal=causal,
        look_backward=back,
        look_forward=fwd,
        autopad=length % window != 0,
        **options,
    )
    assert attn.rel_pos is None  # its defaults add no positional embedding
    return attn


@pytest.mark.parametrize(("window", "back", "fwd", "causal", "length"), LUCIDRAINS)
@pytest.mark.parametrize("pads", [(0, 0), (1, 1)], ids=["unpadded", "padded"])
def test_blocked_equals_lucidrains_local_attention(window, back, fwd, causal, length, pads):
    theirs = _lucidrains(window, back, fwd, causal, length)
    q, k, v = qkv(2, 3, length, seed=4)
    mask = padding_mask(2, length, pads)
    expected = theirs(q, k, v, mask=~mask)  # True = keep there
    options = {"window": window, "look_backward": back, "look_forward": fwd, "causal": causal}
    out = local_blocked_attention(q, k, v, key_padding_mask=mask, **options)
    assert_close(out, expected)


@pytest.mark.parametrize(("window", "back", "fwd", "causal", "length"), LUCIDRAINS)
def test_band_equals_lucidrains_exact_windowsize(window, back, fwd, causal, length):
    theirs = _lucidrains(window, back, fwd, causal, length, exact_windowsize=True)
    q, k, v = qkv(2, 3, length, seed=6)
    ahead = 0 if causal else window * (1 if fwd is None else fwd)
    out = local_attention(q, k, v, look_backward=window * back, look_forward=ahead, causal=causal)
    assert_close(out, theirs(q, k, v, mask=torch.ones(2, length, dtype=torch.bool)))


def test_lucidrains_autopad_without_a_mask_counts_its_zero_padding():
    """The difference the LocalAttention docstring states: without a mask, lucidrains' padded
    zero keys take part in the bidirectional last block (not in the causal one)."""
    q, k, v = qkv(1, 2, 10, seed=7)
    for causal in (False, True):
        theirs = _lucidrains(4, 1, None, causal, 10)(q, k, v)
        ours = local_blocked_attention(q, k, v, window=4, causal=causal)
        assert_close(theirs[:, :, :4], ours[:, :, :4])  # blocks 0 and 1 see no padding
        assert torch.allclose(theirs, ours) is causal
