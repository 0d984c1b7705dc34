"""BigBird: the pattern against an entry-by-entry construction from the paper's rules, the
random blocks (eligible, distinct, uniform), the block-sparse path against the dense
reference (forward and gradients), causality, padding, half precision and the option checks.
The seeded-draw contract is tested for every mechanism in ``test_seeded.py``."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import (
    bigbird_attention,
    bigbird_global_positions,
    bigbird_layout,
    sparse_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv

H = 2
#: (options, L): lengths that blocks do not divide, a global count that is odd and not a
#: multiple of the block, no global tokens, no random blocks, the default block layout,
#: sequences too short for the pattern (full attention) and shorter than one block.
CASES = {
    "b4-w3-r2-g8": ({"block_size": 4, "num_random_blocks": 2, "num_global": 8}, 61),
    "b4-w5-r3-g5": ({"block_size": 4, "num_window_blocks": 5, "num_global": 5}, 70),
    "b8-w1-r1-g0": (
        {"block_size": 8, "num_window_blocks": 1, "num_random_blocks": 1, "num_global": 0},
        83,
    ),
    "b3-w3-r0-g2": ({"block_size": 3, "num_random_blocks": 0, "num_global": 2}, 40),
    "b16-defaults": ({"block_size": 16}, 200),
    "short-full": ({"block_size": 8}, 37),
    "below-a-block": ({"block_size": 8}, 5),
}
IDS = list(CASES)


def _build(seed: int = 0, **options) -> kattn.Attention:
    attn = kattn.build("bigbird", head_dim=16, num_heads=H, seed=seed, **options)
    return attn.double().eval()


def _globals(length: int, num_global: int) -> set[int]:
    front, back = -(-num_global // 2), num_global // 2
    return set(range(min(front, length))) | set(range(max(0, length - back), length))


def _expected(
    length, causal, *, block_size, num_window_blocks, num_random_blocks, num_global, random_sets
):
    """The pattern from the definition, entry by entry: ``random_sets[h][n]`` holds the
    random blocks of head h and query block n (the one random part, checked on its own)."""
    bs, w = block_size, num_window_blocks // 2
    glob = _globals(length, num_global)
    n_blocks = -(-length // bs)
    full = n_blocks <= num_window_blocks + num_random_blocks + len({p // bs for p in glob})
    allowed = torch.zeros(H, length, length, dtype=torch.bool)
    for h in range(H):
        for i in range(length):
            for j in range(length):
                if causal and j > i:
                    continue
                n, m = i // bs, j // bs
                allowed[h, i, j] = (
                    full or i in glob or j in glob or n - w <= m <= n + w or m in random_sets[h][n]
                )
    return allowed


def _options(attn):
    return {
        "block_size": attn.block_size,
        "num_window_blocks": attn.num_window_blocks,
        "num_random_blocks": attn.num_random_blocks,
        "num_global": attn.num_global,
    }


def _random_sets(layout):
    index, valid = layout.random_index.tolist(), layout.random_valid.tolist()
    return [
        [{b for b, ok in zip(row, oks, strict=True) if ok} for row, oks in zip(ih, vh, strict=True)]
        for ih, vh in zip(index, valid, strict=True)
    ]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", IDS)
def test_pattern_is_the_papers_pattern(case, causal):
    options, length = CASES[case]
    attn = _build(**options)
    layout = attn.layout(length, causal=causal)
    expected = _expected(length, causal, **_options(attn), random_sets=_random_sets(layout))
    pattern = attn.pattern(length, causal=causal)
    assert pattern.dtype == torch.bool and pattern.shape == (H, length, length)
    assert torch.equal(pattern, expected)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", IDS)
def test_random_blocks_are_distinct_eligible_and_as_many_as_asked(case, causal):
    """Each query block draws min(r, #eligible) distinct blocks that it does not already read:
    outside its window (before it when causal) and holding no global token."""
    options, length = CASES[case]
    attn = _build(**options)
    layout = attn.layout(length, causal=causal)
    bs, w, r = attn.block_size, attn.num_window_blocks // 2, attn.num_random_blocks
    n_blocks = -(-length // bs)
    global_blocks = {p // bs for p in _globals(length, attn.num_global)}
    for sets in _random_sets(layout):
        for n, chosen in enumerate(sets):
            if layout.full:
                assert not chosen
                continue
            far = range(0, n - w) if causal else [*range(0, n - w), *range(n + w + 1, n_blocks)]
            eligible = set(far) - global_blocks
            assert chosen <= eligible
            assert len(chosen) == min(r, len(eligible))
    assert layout.full == (case in ("short-full", "below-a-block"))


def test_random_blocks_are_uniform_over_the_eligible_ones():
    """40 draws × 50 heads: each of the 9 eligible blocks of query block 5 (12 blocks, window
    4…6) is drawn with probability 3/9; counts stay within 5 standard deviations."""
    counts = torch.zeros(12, dtype=torch.long)
    for seed in range(40):
        layout = bigbird_layout(
            96,
            block_size=8,
            num_window_blocks=3,
            num_random_blocks=3,
            num_global=0,
            num_heads=50,
            generator=torch.Generator().manual_seed(seed),
        )
        counts += torch.bincount(layout.random_index[:, 5].flatten(), minlength=12)
    assert counts[4:7].sum() == 0
    eligible = torch.cat([counts[:4], counts[7:]]).double()
    expected, sd = 2000 / 3, (2000 * (1 / 3) * (2 / 3)) ** 0.5
    assert ((eligible - expected).abs() < 5 * sd).all(), counts


def test_global_tokens_are_the_first_and_last_halves():
    assert bigbird_global_positions(10, 5).tolist() == [0, 1, 2, 8, 9]
    assert bigbird_global_positions(10, 1).tolist() == [0]
    assert bigbird_global_positions(4, 16).tolist() == [0, 1, 2, 3]
    assert bigbird_global_positions(10, 0) is None
    assert _build().num_global == 128  # the first and the last block of 64


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", ["b4-w3-r2-g8", "b4-w5-r3-g5", "b8-w1-r1-g0", "short-full"])
def test_forward_and_gradients_equal_the_reference(case, causal):
    options, length = CASES[case]
    attn = _build(**options)
    q, k, v = qkv(2, H, length, requires_grad=True)
    mask = padding_mask(2, length, (0, 9))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    allowed = attn.pattern(length, causal=causal)
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_padded_values_count_nowhere():
    attn = _build(block_size=4, num_random_blocks=2, num_global=8)
    q, k, v = qkv(2, H, 61)
    mask = padding_mask(2, 61, (0, 13))
    out = attn(q, k, v, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 48:] = float("nan")
    v2[1, :, 48:] = float("inf")
    out2 = attn(q, k2, v2, key_padding_mask=mask)
    assert torch.isfinite(out2).all()
    assert_close(out2, out)
    allowed = attn.pattern(61)
    assert_close(out, sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_fully_padded_sequence_gives_zeros_and_finite_gradients(causal):
    attn = _build(block_size=4, num_random_blocks=2, num_global=8)
    q, k, v = qkv(2, H, 61, requires_grad=True)
    mask = padding_mask(2, 61, (0, 61))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g).all()
        assert_close(g, g_ref)


def test_causal_never_sees_the_future():
    attn = _build(block_size=4, num_random_blocks=2, num_global=8)
    q, k, v = qkv(1, H, 61)
    out = attn(q, k, v, causal=True)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, :, 30:] = 1e3 * torch.randn_like(x[:, :, 30:])
    assert_close(attn(q2, k2, v2, causal=True)[:, :, :30], out[:, :, :30])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_finite_and_close(dtype):
    attn = _build(block_size=8, num_random_blocks=2, num_global=8).float()
    q, k, v = (x.to(dtype) for x in qkv(2, H, 90, scale=3.0))
    for causal in (False, True):
        out = attn(q, k, v, causal=causal)
        ref = attn(q.float(), k.float(), v.float(), causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out.float(), ref, dtype)


def test_functional_attention_checks_the_layout():
    layout = bigbird_layout(
        40, block_size=4, num_window_blocks=3, num_random_blocks=1, num_global=4, num_heads=H
    )
    q, k, v = qkv(1, H, 41)
    with pytest.raises(ValueError, match="L = 40"):
        bigbird_attention(q, k, v, layout)


def test_cross_attention_is_refused_with_a_reason():
    attn = _build(block_size=4)
    q, k, v = qkv(1, H, 20, 24)
    with pytest.raises(NotImplementedError, match="aligned"):
        attn(q, k, v)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block_size": 0}, "block_size must be a positive int, got 0"),
        ({"num_window_blocks": 4}, "num_window_blocks must be odd .* got 4"),
        ({"num_window_blocks": 0}, "num_window_blocks must be a positive int, got 0"),
        ({"num_random_blocks": -1}, "num_random_blocks must be an int >= 0, got -1"),
        ({"num_global": -2}, "num_global must be an int >= 0, got -2"),
        ({"scale": 0.0}, "scale must be positive or None, got 0.0"),
    ],
)
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build("bigbird", head_dim=16, num_heads=H, **options)
