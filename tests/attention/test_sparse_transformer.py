"""Sparse Transformer attention (Child et al. 2019, §4.2–4.3): the strided and fixed patterns
against the paper's definitions written out entry by entry, the block-sparse path against the
dense reference (forward and gradients), padding, causality, half precision and option
checks."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import (
    sparse_attention_reference,
    sparse_transformer_attention,
    sparse_transformer_attention_reference,
    sparse_transformer_pattern,
)

from ..helpers import assert_close, grads, padding_mask, qkv

#: (pattern, stride, c, causal, L): lengths that the stride does not divide, L below one
#: block, a stride of 1, summaries as wide as the block.
CASES = [
    ("strided", 4, 1, False, 23),
    ("strided", 4, 1, True, 23),
    ("strided", 5, 1, True, 37),
    ("strided", 3, 1, False, 2),
    ("strided", 1, 1, True, 9),
    ("strided", 8, 1, False, 70),
    ("fixed", 4, 1, False, 23),
    ("fixed", 5, 2, True, 37),
    ("fixed", 6, 3, False, 29),
    ("fixed", 8, 2, True, 5),
    ("fixed", 3, 3, True, 11),
    ("fixed", 16, 4, False, 70),
]
IDS = [f"{p}-l{s}-c{c}-{'causal' if causal else 'full'}-L{n}" for p, s, c, causal, n in CASES]


def _in_factor(pattern: str, factor: int, i: int, j: int, stride: int, c: int) -> bool:
    """Whether key j is in A(factor)_i, from §4.2 (non-causal forms: without j <= i)."""
    if pattern == "strided":
        return abs(i - j) < stride if factor == 1 else (i - j) % stride == 0
    return i // stride == j // stride if factor == 1 else j % stride >= stride - c


def _expected(pattern, stride, c, causal, length, heads="union", num_heads=1):
    """The pattern written out entry by entry: ``(1 or H, L, L)``."""
    factors = [(1, 2)] if heads == "union" else [(1,)] * -(-num_heads // 2)
    if heads == "split":
        factors += [(2,)] * (num_heads - len(factors))
    allowed = torch.zeros(len(factors), length, length, dtype=torch.bool)
    for h, fs in enumerate(factors):
        for i in range(length):
            for j in range(length):
                seen = any(_in_factor(pattern, f, i, j, stride, c) for f in fs)
                allowed[h, i, j] = seen and (j <= i or not causal)
    return allowed


def _build(**options) -> kattn.Attention:
    return kattn.build("sparse_transformer", head_dim=16, num_heads=3, **options).double()


@pytest.mark.parametrize("heads", ["union", "split"])
@pytest.mark.parametrize(("pattern", "stride", "c", "causal", "length"), CASES, ids=IDS)
def test_pattern_is_the_papers_definition(pattern, stride, c, causal, length, heads):
    attn = _build(pattern=pattern, stride=stride, c=c, heads=heads)
    expected = _expected(pattern, stride, c, causal, length, heads, num_heads=3)
    assert torch.equal(attn.pattern(length, causal=causal), expected)


@pytest.mark.parametrize("heads", ["union", "split"])
@pytest.mark.parametrize(("pattern", "stride", "c", "causal", "length"), CASES, ids=IDS)
def test_fast_path_reads_exactly_the_pattern(pattern, stride, c, causal, length, heads):
    """Zero queries and keys give uniform weights over the keys read, so one-hot values
    (value j = e_j) read back the pattern the block tables, permutation and merge compute."""
    q = torch.zeros(1, 3, length, 4, dtype=torch.float64)
    v = torch.eye(length, dtype=torch.float64).expand(1, 3, length, length)
    options = {"pattern": pattern, "stride": stride, "c": c, "heads": heads, "causal": causal}
    out = sparse_transformer_attention(q, q, v, block_size=4, **options)
    expected = _expected(pattern, stride, c, causal, length, heads, num_heads=3)
    assert torch.equal(out[0] > 0, expected.expand(3, -1, -1))


@pytest.mark.parametrize("heads", ["union", "split"])
@pytest.mark.parametrize(("pattern", "stride", "c", "causal", "length"), CASES[::2], ids=IDS[::2])
def test_forward_and_gradients_equal_the_reference(pattern, stride, c, causal, length, heads):
    attn = _build(pattern=pattern, stride=stride, c=c, heads=heads, block_size=4)
    q, k, v = qkv(2, 3, length, requires_grad=True)
    mask = padding_mask(2, length, (0, length // 3))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    allowed = _expected(pattern, stride, c, causal, length, heads, num_heads=3)
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask)
    assert_close(out, ref)
    assert_close(attn.reference(q, k, v, causal=causal, key_padding_mask=mask), ref)
    options = {"pattern": pattern, "stride": stride, "c": c, "heads": heads, "causal": causal}
    functional_ref = sparse_transformer_attention_reference(
        q, k, v, key_padding_mask=mask, **options
    )
    assert_close(functional_ref, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_block_size_does_not_change_the_result(pattern):
    q, k, v = qkv(1, 2, 45)
    outs = [
        sparse_transformer_attention(q, k, v, pattern=pattern, stride=6, c=2, block_size=bs)
        for bs in (1, 3, 8, 64)
    ]
    for out in outs[1:]:
        assert_close(out, outs[0])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_padded_keys_count_nowhere(pattern, causal):
    attn = _build(pattern=pattern, stride=5, c=2, block_size=4)
    q, k, v = qkv(2, 3, 31)
    mask = padding_mask(2, 31, (0, 8))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 23:] = float("nan")
    v2[1, :, 23:] = float("inf")
    out2 = attn(q, k2, v2, causal=causal, key_padding_mask=mask)
    assert torch.isfinite(out2).all()
    assert_close(out2, out)
    assert_close(out2, attn.reference(q, k, v, causal=causal, key_padding_mask=mask))
    # the padded row is the same attention on its prefix
    trimmed = attn(q[1:, :, :23], k[1:, :, :23], v[1:, :, :23], causal=causal)
    assert_close(out[1:, :, :23], trimmed)


@pytest.mark.parametrize("heads", ["union", "split"])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_causal_never_sees_the_future(pattern, heads):
    attn = _build(pattern=pattern, stride=4, c=2, heads=heads, block_size=4)
    q, k, v = qkv(1, 3, 30)
    out = attn(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 17:] = 1e3 * torch.randn_like(k2[:, :, 17:])
    v2[:, :, 17:] = 1e3 * torch.randn_like(v2[:, :, 17:])
    out2 = attn(q, k2, v2, causal=True)
    assert_close(out2[:, :, :17], out[:, :, :17])
    assert not torch.allclose(out2[:, :, 17:], out[:, :, 17:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_half_precision_is_finite_and_close(pattern, dtype):
    attn = _build(pattern=pattern, stride=6, c=2, block_size=8)
    q, k, v = qkv(2, 3, 40, scale=3.0)
    mask = padding_mask(2, 40, (0, 9))
    q, k, v = (x.to(dtype) for x in (q, k, v))
    out = attn(q, k, v, causal=True, key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # against the float64 reference on the same (rounded) inputs
    ref = attn.reference(q.double(), k.double(), v.double(), causal=True, key_padding_mask=mask)
    assert_close(out, ref, dtype=dtype)


def test_defaults_and_pattern_shapes():
    attn = kattn.build("sparse_transformer", head_dim=8, num_heads=4)
    assert (attn.pattern_name, attn.stride, attn.c, attn.heads) == ("strided", 128, 8, "union")
    assert attn.is_exact and not attn.supports_cross
    assert attn.pattern(10).shape == (1, 10, 10)
    assert attn.pattern(10).all()  # shorter than the stride: every key is in the band
    split = kattn.build("sparse_transformer", head_dim=8, num_heads=5, heads="split", stride=3)
    pattern = split.pattern(10, causal=True)
    assert pattern.shape == (5, 10, 10)
    assert torch.equal(pattern[0], pattern[2]) and not torch.equal(pattern[2], pattern[3])


def test_cross_attention_is_refused_with_a_reason():
    attn = _build(stride=4)
    q, _, _ = qkv(1, 3, 5)
    _, k, v = qkv(1, 3, 7)
    with pytest.raises(NotImplementedError, match="aligned"):
        attn(q, k, v)
    with pytest.raises(ValueError, match="Lq == Lk"):
        sparse_transformer_attention(q, k, v, stride=4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pattern": "dilated"}, "pattern must be one of .* got 'dilated'"),
        ({"heads": "merged"}, "heads must be one of .* got 'merged'"),
        ({"stride": 0}, "stride must be a positive int, got 0"),
        ({"c": 0}, "c must be a positive int, got 0"),
        ({"pattern": "fixed", "stride": 4, "c": 5}, "c must be at most stride=4 .* got 5"),
        ({"block_size": -2}, "block_size must be a positive int, got -2"),
        ({"scale": -1.0}, "scale must be positive or None, got -1.0"),
    ],
)
def test_bad_options_raise_naming_the_option_and_value(options, message):
    with pytest.raises(ValueError, match=message):
        kattn.build("sparse_transformer", head_dim=8, num_heads=2, **options)


def test_split_heads_need_two_heads():
    with pytest.raises(ValueError, match=r"heads='split' needs at least 2 heads.*num_heads=1"):
        kattn.build("sparse_transformer", head_dim=8, num_heads=1, heads="split")
    with pytest.raises(ValueError, match="num_heads=1"):
        sparse_transformer_pattern(4, heads="split", num_heads=1)
