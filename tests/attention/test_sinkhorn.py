"""Sparse Sinkhorn attention: the log-space balancing against the probability-space loops, the
blocked attention against its dense form (forward and gradients), a hard permutation against
exact softmax over the paper's block pattern, SortCut, causality of the summaries and of the
balancing, padding, Gumbel noise in training only, half precision and the option checks."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import (
    sinkhorn_allowed,
    sinkhorn_attention,
    sinkhorn_attention_reference,
    sinkhorn_block_summaries,
    sinkhorn_normalise,
    sinkhorn_normalise_reference,
    sparse_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv

H = 2


def _build(**options) -> kattn.Attention:
    torch.manual_seed(0)
    attn = kattn.build("sinkhorn", head_dim=16, num_heads=H, max_len=96, **options)
    return attn.double().eval()


def _sorting(b: int, n: int, *, causal: bool, present=None, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(b, H, n, n, generator=g, dtype=torch.float64)
    present = torch.ones(b, n, dtype=torch.bool) if present is None else present
    allowed = sinkhorn_allowed(present, causal=causal)
    return sinkhorn_normalise(logits, allowed, iterations=4, causal=causal)


def _permutation(perm: list[int], b: int = 2) -> torch.Tensor:
    """P with P[n, perm[n]] = 1 (block perm[n] brought to place n), or a zero row for -1."""
    p = torch.zeros(b, H, len(perm), len(perm), dtype=torch.float64)
    for n, m in enumerate(perm):
        if m >= 0:
            p[:, :, n, m] = 1.0
    return p


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_log_space_balancing_equals_the_probability_space_loops(causal):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, H, 6, 6, generator=g, dtype=torch.float64, requires_grad=True)
    present = torch.tensor([[True] * 6, [True, True, False, True, True, False]])
    allowed = sinkhorn_allowed(present, causal=causal)
    fast = sinkhorn_normalise(logits, allowed, iterations=3, causal=causal)
    slow = sinkhorn_normalise_reference(logits, allowed, iterations=3, causal=causal)
    assert_close(fast, slow)
    for g_fast, g_slow in zip(grads(fast, logits), grads(slow, logits), strict=True):
        assert_close(g_fast, g_slow)
    assert torch.equal(fast[1][:, [2, 5]], torch.zeros_like(fast[1][:, [2, 5]]))
    assert torch.equal(fast[1][:, :, [2, 5]], torch.zeros_like(fast[1][:, :, [2, 5]]))


def test_many_rounds_give_a_doubly_stochastic_matrix():
    logits = torch.randn(3, H, 7, 7, generator=torch.Generator().manual_seed(2)).double()
    allowed = sinkhorn_allowed(torch.ones(3, 7, dtype=torch.bool), causal=False)
    p = sinkhorn_normalise(logits, allowed, iterations=300)
    ones = torch.ones(3, H, 7, dtype=torch.float64)
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(dim=-1), ones, rtol=0, atol=1e-8)
    torch.testing.assert_close(p.sum(dim=-2), ones, rtol=0, atol=1e-12)


def test_causal_balancing_reads_no_later_row_and_sorts_only_earlier_blocks():
    logits = torch.randn(1, H, 6, 6, generator=torch.Generator().manual_seed(3)).double()
    allowed = sinkhorn_allowed(torch.ones(1, 6, dtype=torch.bool), causal=True)
    p = sinkhorn_normalise(logits, allowed, iterations=5, causal=True)
    assert torch.equal(p.triu(), torch.zeros_like(p))  # m < n only; row 0 is empty
    assert (p.tril(-1)[..., 1:, :].sum(-1) > 0).all()
    changed = logits.clone()
    changed[..., 4:, :] = 50 * torch.randn(changed[..., 4:, :].shape, dtype=torch.float64)
    p2 = sinkhorn_normalise(changed, allowed, iterations=5, causal=True)
    assert torch.equal(p2[..., :4, :], p[..., :4, :])
    assert not torch.allclose(p2[..., 4:, :], p[..., 4:, :])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_block_summaries_are_means_of_the_real_keys(causal):
    _, k, _ = qkv(2, H, 21)
    mask = padding_mask(2, 21, (0, 7))
    summaries, present = sinkhorn_block_summaries(k, 5, causal=causal, key_padding_mask=mask)
    assert summaries.shape == (2, H, 5, 16)
    assert present.tolist() == [[True] * 5, [True, True, True, False, False]]
    for row in range(2):
        for n in range(5):
            span = range(n * 5 + 1) if causal else range(n * 5, min(n * 5 + 5, 21))
            real = [j for j in span if j < 21 and not mask[row, j]]
            expected = k[row, :, real].mean(dim=1) if real else torch.zeros(H, 16).double()
            assert_close(summaries[row, :, n], expected)


CASES = {  # id: (L, block, causal, sortcut, pads)
    "61-b8": (61, 8, False, None, None),
    "61-b8-pad": (61, 8, False, None, (0, 13)),
    "61-b8-causal": (61, 8, True, None, None),
    "61-b8-causal-pad": (61, 8, True, None, (0, 13)),
    "45-b16-pad": (45, 16, False, None, (3, 20)),
    "61-b8-sortcut3": (61, 8, False, 3, (0, 13)),
    "20-b8-sortcut9": (20, 8, False, 9, None),
    "5-b8": (5, 8, True, None, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_blocked_attention_equals_the_dense_form(case):
    length, bs, causal, sortcut, pads = CASES[case]
    n = -(-length // bs)
    q, k, v = qkv(2, H, length, requires_grad=True)
    sorting = _sorting(2, n, causal=causal).requires_grad_()
    mask = None if pads is None else padding_mask(2, length, pads)
    options = {"block_size": bs, "causal": causal, "key_padding_mask": mask, "sortcut": sortcut}
    out = sinkhorn_attention(q, k, v, sorting, **options)
    ref = sinkhorn_attention_reference(q, k, v, sorting, **options)
    assert out.shape == (2, H, length, 8)
    assert_close(out, ref)
    inputs = (q, k, v, sorting)
    for g_fast, g_slow in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(g_fast, g_slow)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_hard_permutation_gives_softmax_over_the_sorted_and_the_own_block(causal):
    """With P a permutation, block n reads block π(n) and itself: exact softmax over that
    block pattern (π(n) ≠ n, so no key appears twice; causal: π(n) < n, block 0 alone)."""
    length, bs = 38, 8  # 5 blocks, the last one partial
    perm = [-1, 0, 0, 1, 2] if causal else [3, 4, 0, 1, 2]
    q, k, v = qkv(2, H, length)
    mask = padding_mask(2, length, (0, 3))
    out = sinkhorn_attention(
        q, k, v, _permutation(perm), block_size=bs, causal=causal, key_padding_mask=mask
    )
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    sorted_block = torch.tensor(perm)[i // bs]
    allowed = (j // bs == sorted_block) | ((j // bs == i // bs) & ((j <= i) | (not causal)))
    assert_close(out, sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask))


def test_sortcut_with_a_hard_permutation_reads_the_first_sorted_blocks_only():
    length, bs = 45, 8
    q, k, v = qkv(2, H, length)
    mask = padding_mask(2, length, (0, 6))
    out = sinkhorn_attention(
        q, k, v, _permutation([4, 1, 5, 0, 2, 3]), block_size=bs, sortcut=2,
        key_padding_mask=mask,
    )  # fmt: skip
    j = torch.arange(length)[None, :] // bs
    allowed = ((j == 4) | (j == 1)).expand(length, length)
    assert_close(out, sparse_attention_reference(q, k, v, allowed, key_padding_mask=mask))


@pytest.mark.parametrize("options", [{}, {"sortcut": 2}], ids=["local", "sortcut"])
def test_the_module_equals_its_reference_and_sorts_through_its_parameters(options):
    attn = _build(block_size=8, **options)
    q, k, v = qkv(2, H, 61, requires_grad=True)
    mask = padding_mask(2, 61, (0, 13))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert_close(out, ref)
    tensors = (q, k, v, attn.sort_weight, attn.sort_bias)
    fast = grads(out, *tensors)
    for g_fast, g_slow in zip(fast, grads(ref, *tensors), strict=True):
        assert_close(g_fast, g_slow)
    assert fast[3].abs().sum() > 0  # the keys sort the blocks through the sorting network


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padding_is_truncation(causal):
    """Padded keys count nowhere, summaries and balancing included: 40 real tokens padded to
    64 give the outputs of the 40 tokens alone, even with NaN and inf in the padding."""
    attn = _build(block_size=16)
    q, k, v = qkv(1, H, 64)
    short = attn(q[:, :, :40], k[:, :, :40], v[:, :, :40], causal=causal)
    mask = padding_mask(1, 64, (24,))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 40:], v2[:, :, 40:] = float("nan"), float("inf")
    out = attn(q, k2, v2, causal=causal, key_padding_mask=mask)
    assert torch.isfinite(out[:, :, :40]).all()
    assert_close(out[:, :, :40], short)


def test_causal_never_sees_the_future():
    attn = _build(block_size=8)
    q, k, v = qkv(1, H, 61)
    out = attn(q, k, v, causal=True)
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:
        x[:, :, 30:] = 1e2 * torch.randn_like(x[:, :, 30:])
    assert_close(attn(*changed, causal=True)[:, :, :30], out[:, :, :30])


def test_gumbel_noise_in_training_only():
    attn = _build(block_size=8)
    q, k, v = qkv(2, H, 61)
    torch.manual_seed(1)
    evaluated = attn(q, k, v)
    torch.manual_seed(2)
    assert torch.equal(attn(q, k, v), evaluated)
    attn.train()
    first, second = attn(q, k, v), attn(q, k, v)
    assert not torch.allclose(first, second) and not torch.allclose(first, evaluated)
    attn.gumbel_noise = False
    assert torch.equal(attn(q, k, v), evaluated)


def test_a_loaded_state_dict_reproduces_the_outputs():
    a, b = _build(block_size=8), _build(block_size=8)
    with torch.no_grad():
        b.sort_weight.normal_()
    q, k, v = qkv(2, H, 61)
    assert not torch.allclose(a(q, k, v), b(q, k, v))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(q, k, v), b(q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_finite_and_close(dtype):
    attn = _build(block_size=8).float()
    q, k, v = (x.to(dtype) for x in qkv(2, H, 61, scale=2.0))
    for causal in (False, True):
        out = attn(q, k, v, causal=causal)
        ref = attn(q.float(), k.float(), v.float(), causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out.float(), ref, dtype)


def test_refusals_name_the_reason():
    q, k, v = qkv(1, H, 40)
    with pytest.raises(NotImplementedError, match="SortCut"):
        _build(sortcut=2)(q, k, v, causal=True)
    assert not kattn.build(
        "sinkhorn", head_dim=16, num_heads=H, max_len=96, sortcut=1
    ).supports_causal
    with pytest.raises(NotImplementedError, match="same sequence"):
        _build()(*qkv(1, H, 20, 24))
    with pytest.raises(ValueError, match="max_len=96"):
        _build()(*qkv(1, H, 97))
    with pytest.raises(ValueError, match="needs max_len"):
        kattn.build("sinkhorn", head_dim=16, num_heads=H)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block_size": 0}, "block_size must be a positive int, got 0"),
        ({"sinkhorn_iters": 0}, "sinkhorn_iters must be a positive int, got 0"),
        ({"temperature": 0.0}, "temperature must be"),
        ({"sortcut": 0}, "sortcut must be a positive int, got 0"),
        ({"scale": -1.0}, "scale must be positive or None"),
    ],
)
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build("sinkhorn", head_dim=16, num_heads=H, max_len=96, **options)
