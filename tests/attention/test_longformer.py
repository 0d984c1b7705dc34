"""Longformer attention: the pattern against the paper's definition written entry by entry, the
block-sparse path against the dense reference (forward and gradients), padding, causality,
half precision and the option checks."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import longformer_attention, sparse_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv

#: (options, causal, L): windows not aligned with the blocks, lengths that blocks do not
#: divide, L shorter than a block, dilations, explicit global positions, no global token.
CASES = [
    ({"window": 5, "block_size": 8}, False, 37),
    ({"window": 6, "block_size": 8}, True, 37),
    ({"window": 6, "dilation": 2, "num_global": 2, "block_size": 4}, True, 29),
    ({"window": 4, "dilation": 3, "global_positions": [0, 7, 20], "block_size": 8}, False, 23),
    ({"window": 7, "dilation": 2, "global_positions": [3, 11], "block_size": 4}, True, 26),
    ({"window": 8, "num_global": 0, "block_size": 16}, False, 13),
    ({"window": 3, "num_global": 0, "dilation": 4, "block_size": 16}, True, 13),
    ({"window": 1, "num_global": 3, "block_size": 4}, True, 10),
    ({"window": 2, "num_global": 5, "block_size": 4}, False, 3),
    ({"window": 9, "global_positions": "4, 0", "block_size": 4}, False, 30),
    ({}, False, 41),
]
IDS = [
    f"{'causal' if c else 'bidir'}-L{n}-" + ",".join(f"{k}={v}" for k, v in o.items())
    for o, c, n in CASES
]


def _expected(length: int, options: dict, causal: bool) -> torch.Tensor:
    """Beltagy et al. 2020, §3.1, entry by entry: key j is in query i's window iff
    ``j = i + d·m`` for an m of the window range; a global token reads every key and every
    query reads it (only ``j ≤ i`` when causal)."""
    window, d = options.get("window", 512), options.get("dilation", 1)
    positions = options.get("global_positions")
    if isinstance(positions, str):
        positions = [int(x) for x in positions.split(",")]
    if positions is None:
        positions = range(options.get("num_global", 1))
    back, fwd = (window - 1, 0) if causal else (window // 2, window - 1 - window // 2)
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            in_window = (j - i) % d == 0 and -back <= (j - i) // d <= fwd
            is_global = i in positions or j in positions
            allowed[i, j] = in_window or (is_global and (j <= i or not causal))
    return allowed


def _build(**options) -> kattn.Attention:
    return kattn.build("longformer", head_dim=16, num_heads=3, **options).double().eval()


@pytest.mark.parametrize(("options", "causal", "length"), CASES, ids=IDS)
def test_pattern_is_the_papers_definition(options, causal, length):
    pattern = _build(**options).pattern(length, causal=causal)
    assert pattern.shape == (1, length, length) and pattern.dtype == torch.bool
    assert torch.equal(pattern[0], _expected(length, options, causal))


@pytest.mark.parametrize(("options", "causal", "length"), CASES, ids=IDS)
def test_forward_and_gradients_equal_the_dense_pattern(options, causal, length):
    attn = _build(**options)
    q, k, v = qkv(2, 3, length, requires_grad=True)
    mask = padding_mask(2, length, (0, min(3, length - 1)))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    allowed = _expected(length, options, causal)
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask)
    assert_close(out, ref)
    assert_close(attn.reference(q, k, v, causal=causal, key_padding_mask=mask), ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_block_table_reads_exactly_the_pattern():
    """One-hot values read back which keys each query saw (uniform weights when q = k = 0)."""
    options = {"window": 5, "dilation": 3, "global_positions": [2, 9]}
    for causal in (False, True):
        q = torch.zeros(1, 3, 19, 16, dtype=torch.float64)
        v = torch.eye(19, dtype=torch.float64)[None, None].expand(1, 3, 19, 19)
        seen = _build(**options, block_size=4)(q, q, v, causal=causal)[0, 0] > 0
        assert torch.equal(seen, _expected(19, options, causal))


@pytest.mark.parametrize("dilation", [1, 3])
def test_block_size_does_not_change_the_result(dilation):
    q, k, v = qkv(1, 3, 45)
    outs = [
        _build(window=9, dilation=dilation, global_positions=[0, 30], block_size=bs)(q, k, v)
        for bs in (1, 3, 8, 64)
    ]
    for out in outs[1:]:
        assert_close(out, outs[0])


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_count_nowhere_global_ones_included(dilation, causal):
    attn = _build(window=7, dilation=dilation, global_positions=[0, 26], block_size=4)
    q, k, v = qkv(2, 3, 30)
    mask = padding_mask(2, 30, (0, 6))  # row 1 pads 24…29: global position 26 is padding
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 24:] = float("nan")
    v2[1, :, 24:] = float("nan")
    out2 = attn(q, k2, v2, causal=causal, key_padding_mask=mask)
    assert torch.isfinite(out2).all()
    assert_close(out2, out)
    allowed = _expected(
        30, {"window": 7, "dilation": dilation, "global_positions": [0, 26]}, causal
    )
    assert_close(out, sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask))


@pytest.mark.parametrize("dilation", [1, 2])
def test_causal_never_sees_the_future(dilation):
    attn = _build(window=5, dilation=dilation, global_positions=[0, 9, 21], block_size=4)
    q, k, v = qkv(1, 3, 30)
    out = attn(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 17:] = 1e3 * torch.randn_like(k2[:, :, 17:])
    v2[:, :, 17:] = 1e3 * torch.randn_like(v2[:, :, 17:])
    assert_close(attn(q, k2, v2, causal=True)[:, :, :17], out[:, :, :17])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dilation", [1, 2])
def test_half_precision_is_finite_and_close(dtype, dilation):
    attn = _build(window=6, dilation=dilation, num_global=2, block_size=8).float()
    q, k, v = qkv(2, 3, 33, scale=3.0, dtype=dtype)
    mask = padding_mask(2, 33, (0, 5))
    out = attn(q, k, v, key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = attn.reference(q.double(), k.double(), v.double(), key_padding_mask=mask)
    assert_close(out, ref, dtype=dtype)


def test_global_positions_are_given_as_a_list_or_a_string():
    by_list = _build(window=3, global_positions=[5, 0, 5])
    by_text = _build(window=3, global_positions="0,5")
    assert by_list.global_positions == by_text.global_positions == (0, 5)
    assert torch.equal(by_list.pattern(9), by_text.pattern(9))
    assert _build(window=3, num_global=4, global_positions=[]).global_tokens(9) == ()
    assert _build(num_global=4).global_tokens(2) == (0, 1)


def test_functional_takes_a_tensor_of_positions():
    q, k, v = qkv(1, 2, 21)
    tokens = torch.tensor([3, 0])
    out = longformer_attention(
        q, k, v, look_backward=2, look_forward=2, dilation=2, global_tokens=tokens
    )
    same = longformer_attention(
        q, k, v, look_backward=2, look_forward=2, dilation=2, global_tokens=[0, 3]
    )
    assert_close(out, same)


def test_empty_batch_gives_an_empty_output():
    q, k, v = qkv(0, 3, 12)
    assert _build(window=4, dilation=2)(q, k, v).shape == (0, 3, 12, 8)


def test_cross_attention_is_refused_with_a_reason():
    attn = _build(window=4)
    q, _, _ = qkv(1, 3, 5)
    _, k, v = qkv(1, 3, 7)
    with pytest.raises(NotImplementedError, match="aligned"):
        attn(q, k, v)
    with pytest.raises(ValueError, match="Lq == Lk"):
        longformer_attention(q, k, v, look_backward=1, look_forward=1)


def test_a_global_position_beyond_the_sequence_is_refused():
    attn = _build(window=4, global_positions=[2, 40])
    q, k, v = qkv(1, 3, 30)
    with pytest.raises(ValueError, match=r"global_positions.*30"):
        attn(q, k, v)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"window": 0}, "window"),
        ({"window": 2.0}, "window"),
        ({"dilation": 0}, "dilation"),
        ({"num_global": -1}, "num_global"),
        ({"global_positions": [-1]}, "global_positions"),
        ({"global_positions": [1.5]}, "global_positions"),
        ({"global_positions": [True]}, "global_positions"),
        ({"global_positions": "0,x"}, "global_positions"),
        ({"global_positions": 3}, "global_positions"),
        ({"block_size": 0}, "block_size"),
        ({"scale": -1.0}, "scale"),
    ],
)
def test_bad_options_raise_naming_the_option(options, name):
    with pytest.raises(ValueError, match=name):
        kattn.build("longformer", head_dim=8, num_heads=2, **options)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"look_backward": -1, "look_forward": 0}, "look_backward"),
        ({"look_backward": 1, "look_forward": -1}, "look_forward"),
        ({"look_backward": 1, "look_forward": 1, "dilation": 0}, "dilation"),
        ({"look_backward": 1, "look_forward": 1, "block_size": 0}, "block_size"),
        ({"look_backward": 1, "look_forward": 1, "global_tokens": [9]}, "global_tokens"),
    ],
)
def test_functional_bad_arguments_raise_naming_them(kwargs, name):
    q, k, v = qkv(1, 2, 5)
    with pytest.raises(ValueError, match=name):
        longformer_attention(q, k, v, **kwargs)
