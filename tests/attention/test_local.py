"""Local (sliding-window) attention: the band pattern, the block-sparse path against the dense
reference (forward and gradients), causality, padding, and ring-buffer decoding."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import (
    LocalState,
    block_pattern_to_dense,
    local_attention,
    local_init_state,
    local_pattern,
    local_step,
    sparse_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv

#: (look_backward, look_forward, causal, L, block_size): windows not aligned with the blocks,
#: lengths that blocks do not divide, windows wider than the sequence, a zero-width band.
BANDS = [
    (3, 2, False, 37, 8),
    (5, 0, False, 37, 8),
    (0, 6, False, 29, 4),
    (9, 9, True, 37, 8),
    (17, 3, False, 70, 16),
    (40, 40, False, 23, 8),
    (0, 0, False, 13, 4),
    (0, 0, True, 13, 4),
    (7, 1, True, 1, 4),
    (64, 63, False, 130, 64),
]


def _expected_band(length: int, back: int, fwd: int, causal: bool) -> torch.Tensor:
    """The band written out entry by entry, independently of local_pattern."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            allowed[i, j] = i - back <= j <= (i if causal else i + fwd)
    return allowed


def _build(**options) -> kattn.Attention:
    torch.manual_seed(0)
    return kattn.build("local", head_dim=16, num_heads=3, **options).double().eval()


@pytest.mark.parametrize(("back", "fwd", "causal", "length", "bs"), BANDS)
def test_pattern_is_the_band(back, fwd, causal, length, bs):
    expected = _expected_band(length, back, fwd, causal)
    assert torch.equal(local_pattern(length, length, back, fwd, causal), expected)


@pytest.mark.parametrize(("back", "fwd", "causal", "length", "bs"), BANDS)
def test_block_table_covers_exactly_the_band(back, fwd, causal, length, bs):
    """The outputs of the block-sparse path are those of the dense band: a query row of
    one-hot values reads back which keys it was allowed to see."""
    q = torch.zeros(1, 1, length, 4, dtype=torch.float64)
    k = torch.zeros_like(q)
    v = torch.eye(length, dtype=torch.float64)[None, None]  # value j = e_j
    out = local_attention(
        q, k, v, look_backward=back, look_forward=fwd, causal=causal, block_size=bs
    )
    seen = out[0, 0] > 0  # uniform weights over the allowed keys
    assert torch.equal(seen, _expected_band(length, back, fwd, causal))


@pytest.mark.parametrize(("back", "fwd", "causal", "length", "bs"), BANDS)
def test_forward_and_gradients_equal_the_reference(back, fwd, causal, length, bs):
    q, k, v = qkv(2, 3, length, requires_grad=True)
    out = local_attention(
        q, k, v, look_backward=back, look_forward=fwd, causal=causal, block_size=bs
    )
    allowed = local_pattern(length, length, back, fwd, causal)
    ref = sparse_attention_reference(q, k, v, allowed)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


@pytest.mark.parametrize(
    ("options", "causal"),
    [
        ({"window": 5, "block_size": 4}, False),
        ({"window": 6, "block_size": 4}, True),
        ({"window": 8, "look_forward": 1, "block_size": 8}, False),
        ({"window": 256}, False),
        ({"look_backward": 10, "look_forward": 3, "block_size": 16}, True),
        ({"window": 5, "variant": "blocked"}, False),
        ({"window": 6, "variant": "blocked"}, True),
        ({"window": 4, "look_backward": 2, "look_forward": 0, "variant": "blocked"}, False),
        ({"window": 7, "look_backward": 0, "block_size": 3, "variant": "blocked"}, True),
        ({"window": 64, "variant": "blocked"}, False),
    ],
)
def test_module_forward_equals_reference(options, causal):
    attn = _build(**options)
    q, k, v = qkv(2, 3, 41, requires_grad=True)
    mask = padding_mask(2, 41, (0, 6))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_default_window_reads_window_keys():
    attn = _build(window=7)
    assert attn.band(False) == (3, 3)
    assert attn.band(True) == (6, 0)
    attn = _build(window=256)
    assert attn.band(False) == (128, 127)
    assert attn.band(True) == (255, 0)
    assert _build(window=8, look_backward=2).band(True) == (2, 0)
    blocked = _build(window=8, variant="blocked")  # in blocks, as lucidrains' local-attention
    assert (blocked.band(False), blocked.band(True)) == ((1, 1), (1, 0))
    assert blocked.block_size == 8 and _build(window=8).block_size == 64


@pytest.mark.parametrize("variant", ["exact", "blocked"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 6, 23])
def test_pattern_is_the_variants_dense_mask(variant, causal, length):
    attn = _build(window=6, look_backward=2, look_forward=1, variant=variant)
    pattern = attn.pattern(length, causal=causal)
    assert pattern.shape == (1, length, length) and pattern.dtype == torch.bool
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    if variant == "exact":
        expected = _expected_band(length, 2, 1, causal)
    else:  # written from block numbers: two blocks of 6 back, one forward
        gap = j // 6 - i // 6
        expected = (gap >= -2) & ((j <= i) if causal else (gap <= 1))
    assert torch.equal(pattern[0], expected)
    with pytest.raises(ValueError, match="causal"):
        attn.pattern(length, causal=1)  # type: ignore[arg-type]


def test_block_size_does_not_change_the_result():
    q, k, v = qkv(1, 2, 45)
    outs = [
        local_attention(q, k, v, look_backward=6, look_forward=4, block_size=bs)
        for bs in (1, 3, 8, 64)
    ]
    for out in outs[1:]:
        assert_close(out, outs[0])


def test_causal_no_leak():
    attn = _build(window=9, block_size=4)
    q, k, v = qkv(1, 3, 30)
    out = attn(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 17:] = 1e3 * torch.randn_like(k2[:, :, 17:])
    v2[:, :, 17:] = 1e3 * torch.randn_like(v2[:, :, 17:])
    out2 = attn(q, k2, v2, causal=True)
    assert_close(out2[:, :, :17], out[:, :, :17])


def test_padding_invariance():
    attn = _build(window=9, block_size=4)
    q, k, v = qkv(2, 3, 30)
    mask = padding_mask(2, 30, (0, 7))
    out = attn(q, k, v, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 23:] = float("nan")
    v2[1, :, 23:] = float("inf")
    out2 = attn(q, k2, v2, key_padding_mask=mask)
    assert_close(out2, out)
    # the unpadded row is plain local attention; the padded one equals attention on its prefix
    assert_close(out[:1], attn(q[:1], k[:1], v[:1]))
    trimmed = attn(q[1:, :, :23], k[1:, :, :23], v[1:, :, :23])
    assert_close(out[1:, :, :23], trimmed)


@pytest.mark.parametrize(
    ("window", "variant", "slots"),
    [(1, "exact", 1), (4, "exact", 4), (9, "exact", 9), (1, "blocked", 2), (4, "blocked", 8)],
)
def test_steps_equal_the_causal_forward_with_constant_memory(window, variant, slots):
    attn = _build(window=window, block_size=4, variant=variant)
    length = 3 * window + 5
    q, k, v = qkv(2, 3, length)
    expected = attn(q, k, v, causal=True)
    state = attn.init_state(2, 3, dtype=torch.float64)
    shapes = (state.keys.shape, state.values.shape[:-1])
    outs = []
    for t in range(length):
        out, state = attn.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        outs.append(out)
        assert isinstance(state, LocalState)
        assert (state.keys.shape, state.values.shape[:-1]) == shapes  # never grows
    assert state.keys.shape[2] == slots and state.length == length
    assert_close(torch.cat(outs, dim=2), expected)


@pytest.mark.parametrize(("variant", "slots"), [("exact", 6), ("blocked", 12)])
def test_prefill_equals_the_causal_forward(variant, slots):
    attn = _build(window=6, block_size=4, variant=variant)
    q, k, v = qkv(2, 3, 27)
    expected = attn(q, k, v, causal=True)
    out, state = attn.prefill(q, k, v)
    assert_close(out, expected)
    assert state.keys.shape[2] == slots and state.length == 27
    first, state = attn.prefill(q[:, :, :11], k[:, :, :11], v[:, :, :11])
    second, _ = attn.prefill(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], state)
    assert_close(torch.cat([first, second], dim=2), expected)


def test_step_gradients_match_the_forward():
    attn = _build(window=4, block_size=4)
    q, k, v = qkv(1, 3, 11, requires_grad=True)
    expected = attn(q, k, v, causal=True)
    out, _ = attn.prefill(q, k, v)
    for g, g_ref in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_functional_step_refuses_a_foreign_state():
    q, k, v = qkv(1, 2, 1, d=4, dv=4)
    with pytest.raises(ValueError, match="LocalState"):
        local_step(q, k, v, ("not", "a", "state"))  # type: ignore[arg-type]
    state = local_init_state(1, 2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="q_t and k_t"):
        local_step(q[..., :3], k[..., :3], v, state)


def test_block_pattern_matches_local_pattern():
    """The dense form of the block table the functional builds equals the band (a second,
    block-level view of test_block_table_covers_exactly_the_band)."""
    back, fwd, length, bs = 5, 2, 19, 4
    n = -(-length // bs)
    offsets = torch.arange(-2, 2)
    index = torch.arange(n)[:, None] + offsets
    valid = (index >= 0) & (index < n)

    def band(i, j):
        return (j >= i - back) & (j <= i + fwd)

    dense = block_pattern_to_dense(index, valid, band, length, length, bs)[0, 0]
    assert torch.equal(dense, local_pattern(length, length, back, fwd))


def test_cross_attention_is_refused_with_a_reason():
    attn = _build(window=4)
    q, _, _ = qkv(1, 3, 5)
    _, k, v = qkv(1, 3, 7)
    with pytest.raises(NotImplementedError, match="aligned"):
        attn(q, k, v)
    with pytest.raises(ValueError, match="Lq == Lk"):
        local_attention(q, k, v, look_backward=1, look_forward=1)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"window": 0}, "window"),
        ({"window": -3}, "window"),
        ({"look_backward": -1}, "look_backward"),
        ({"look_forward": -2}, "look_forward"),
        ({"block_size": 0}, "block_size"),
        ({"scale": -1.0}, "scale"),
        ({"variant": "lra"}, "variant"),
        ({"variant": "blocked", "window": 0}, "window"),
    ],
)
def test_bad_options_raise_naming_the_option(options, name):
    with pytest.raises(ValueError, match=name):
        kattn.build("local", head_dim=8, num_heads=2, **options)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"look_backward": -1, "look_forward": 0}, "look_backward"),
        ({"look_backward": 1, "look_forward": -1}, "look_forward"),
        ({"look_backward": 1, "look_forward": 1, "block_size": 0}, "block_size"),
    ],
)
def test_functional_bad_arguments_raise_naming_them(kwargs, name):
    q, k, v = qkv(1, 2, 5)
    with pytest.raises(ValueError, match=name):
        local_attention(q, k, v, **kwargs)
