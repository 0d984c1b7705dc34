"""Global tokens on the block-sparse core: the dense rule written entry by entry, and the
gathered computation equal to the dense reference on it (forward, gradients, causal,
padding, half inputs)."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import (
    add_global_tokens,
    block_pattern_to_dense,
    block_sparse_attention,
    block_sparse_attention_with_globals,
    merge_partial_attention,
    sparse_attention_reference,
)
from tests.helpers import assert_close, grads, padding_mask, qkv

from .test_sparse import random_table


def _expected(base, global_keys, global_queries, causal):
    """The global rule applied entry by entry to a (Lq, Lk) pattern."""
    lq, lk = base.shape
    out = base.clone()
    for i in range(lq):
        for j in range(lk):
            visible = j <= i or not causal
            if visible and (i in global_queries or j in global_keys):
                out[i, j] = True
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_dense_rule_matches_an_explicit_loop(causal):
    g = torch.Generator().manual_seed(1)
    base = torch.rand(11, 11, generator=g) < 0.3
    gk, gq = [0, 4, 10], [2, 4]
    got = add_global_tokens(
        base, global_keys=torch.tensor(gk), global_queries=torch.tensor(gq), causal=causal
    )
    assert torch.equal(got, _expected(base, gk, gq, causal))


# (Lq = Lk, block, n key blocks per row, global keys, global queries, causal)
CASES = [
    (37, 8, 2, [0, 1, 2], [0, 1, 2], False),
    (37, 8, 2, [0, 1, 2], [0, 1, 2], True),
    (37, 8, 3, [5, 20, 36], [], False),
    (29, 4, 3, [], [3, 28], True),
    (50, 8, 2, list(range(0, 50, 5)), [7], True),  # more global keys than one block holds
    (16, 4, 1, [15], [15], False),
]


#: a causal call needs a causal block pattern, so no token mask only for non-causal cases
MASKED_CASES = [
    (*case, kind)
    for case in CASES
    for kind in ("callable", "tensor", "none")
    if kind != "none" or not case[-1]
]


@pytest.mark.parametrize(("length", "bs", "kmax", "gk", "gq", "causal", "mask_kind"), MASKED_CASES)
def test_equals_the_reference_forward_and_gradients(length, bs, kmax, gk, gq, causal, mask_kind):
    n = -(-length // bs)
    idx, valid = random_table(2, 3, n, n, kmax, seed=length + kmax, with_valid=True)

    def near(i, j):
        close = (i - j).abs() <= 3
        return close & (j <= i) if causal else close

    window = {"callable": near, "tensor": _as_tensor(near, idx, bs), "none": None}[mask_kind]

    q, k, v = qkv(2, 3, length, requires_grad=True)
    gk_t, gq_t = torch.tensor(gk, dtype=torch.long), torch.tensor(gq, dtype=torch.long)
    out = block_sparse_attention_with_globals(
        q,
        k,
        v,
        idx,
        block_size=bs,
        block_valid=valid,
        token_mask=window,
        global_keys=gk_t,
        global_queries=gq_t,
        causal=causal,
    )
    base = block_pattern_to_dense(idx, valid, window, length, length, bs)
    allowed = add_global_tokens(base, global_keys=gk_t, global_queries=gq_t, causal=causal)
    ref = sparse_attention_reference(q, k, v, allowed)
    assert_close(out, ref)
    for g_out, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g_out, g_ref)


def _as_tensor(mask_fn, idx, bs):
    """The token mask ``mask_fn`` written out as the core's ``(B, H, nQ, block, K·block)``
    tensor for the block table ``idx``."""
    n_q = idx.shape[2]
    query_pos = (torch.arange(n_q)[:, None] * bs + torch.arange(bs))[..., None]
    key_pos = (idx[..., None] * bs + torch.arange(bs)).flatten(-2)[..., None, :]
    return mask_fn(query_pos, key_pos)


def test_global_keys_are_counted_once():
    """A global key that is also in a query's own window must not get double weight: with
    equal scores every allowed key gets the same weight, so a one-hot value reads it back."""
    length, bs = 12, 4
    q = torch.zeros(1, 1, length, 2, dtype=torch.float64)
    v = torch.eye(length, dtype=torch.float64)[None, None]
    n = length // bs
    idx = torch.arange(n)[:, None]  # each block reads itself
    out = block_sparse_attention_with_globals(
        q, q, v, idx, block_size=bs, global_keys=torch.tensor([0, 5])
    )
    row = out[0, 0, 5]  # query 5: its block 4..7 plus global key 0; key 5 is in both
    assert_close(row[[0, 4, 5, 6, 7]], torch.full((5,), 0.2, dtype=torch.float64))
    assert row.sum().item() == pytest.approx(1.0)


def test_padding_counts_nowhere_even_as_a_global_token():
    length, bs = 24, 8
    q, k, v = qkv(2, 2, length, requires_grad=True)
    pad = padding_mask(2, length, (0, 5))
    pad[1, 0] = True  # a padded global token
    with torch.no_grad():
        v[pad[:, None, :, None].expand_as(v)] = float("nan")
    n = length // bs
    idx = torch.arange(n)[:, None]
    gk = torch.tensor([0, 1])
    out = block_sparse_attention_with_globals(
        q,
        k,
        v,
        idx,
        block_size=bs,
        global_keys=gk,
        global_queries=gk,
        key_padding_mask=pad,
    )
    allowed = add_global_tokens(
        block_pattern_to_dense(idx, None, None, length, length, bs),
        global_keys=gk,
        global_queries=gk,
    )
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=pad)
    assert torch.isfinite(out).all()
    assert_close(out, ref)
    for g in grads(out, q, k):
        assert torch.isfinite(g).all()


def test_half_inputs_stay_finite_and_close():
    length, bs = 64, 16
    q, k, v = qkv(1, 2, length, scale=4.0)
    idx = torch.arange(length // bs)[:, None]
    gk = torch.tensor([0, 63])
    out = block_sparse_attention_with_globals(
        q.half(), k.half(), v.half(), idx, block_size=bs, global_keys=gk, global_queries=gk
    )
    q, k, v = (x.half().double() for x in (q, k, v))  # the same rounded inputs
    ref = block_sparse_attention_with_globals(
        q, k, v, idx, block_size=bs, global_keys=gk, global_queries=gk
    )
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_keys": torch.tensor([0, 40])}, "global_keys must lie in"),
        ({"global_queries": torch.tensor([[0]])}, "global_queries must be a 1-D integer"),
        ({"global_keys": torch.tensor([0.5])}, "global_keys must be a 1-D integer"),
        ({"block_index": torch.arange(3)[:, None]}, "block_index must be broadcastable"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    q, k, v = qkv(1, 1, 16)
    with pytest.raises(ValueError, match=message):
        arguments = {"block_index": torch.arange(4)[:, None], "global_keys": torch.tensor([1])}
        block_sparse_attention_with_globals(q, k, v, block_size=4, **(arguments | kwargs))


def test_lse_is_the_log_sum_exp_of_the_allowed_logits():
    length, bs = 21, 4
    n = -(-length // bs)
    idx, valid = random_table(1, 2, n, n, 2, seed=9, with_valid=True)
    q, k, v = qkv(1, 2, length)
    _, lse = block_sparse_attention(q, k, v, idx, block_size=bs, block_valid=valid, return_lse=True)
    allowed = block_pattern_to_dense(idx, valid, None, length, length, bs)
    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    expected = torch.logsumexp(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    assert torch.equal(torch.isinf(lse), torch.isinf(expected))  # empty rows: −∞
    finite = torch.isfinite(expected)
    assert_close(lse[finite], expected[finite])


@pytest.mark.parametrize("seed", [0, 1])
def test_merging_disjoint_parts_is_one_softmax_over_their_union(seed):
    """Split a pattern at random into two disjoint parts (a token mask and its complement on
    the same blocks): the merged result is attention over the union, forward and gradients;
    rows empty in one part or in both are handled."""
    length, bs = 30, 4
    n = -(-length // bs)
    idx, valid = random_table(2, 2, n, n, 3, seed=seed, with_valid=True)
    g = torch.Generator().manual_seed(seed)
    split = torch.rand(length, length, generator=g) < 0.5

    def part(inside):
        return lambda i, j: split[i.clamp(max=length - 1), j.clamp(max=length - 1)] == inside

    q, k, v = qkv(2, 2, length, requires_grad=True)
    parts = [
        block_sparse_attention(
            q, k, v, idx, block_size=bs, block_valid=valid, token_mask=part(side), return_lse=True
        )
        for side in (True, False)
    ]
    out = merge_partial_attention(parts)
    allowed = block_pattern_to_dense(idx, valid, None, length, length, bs)
    ref = sparse_attention_reference(q, k, v, allowed)
    assert_close(out, ref)
    for g_out, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g_out).all()
        assert_close(g_out, g_ref)


def test_merging_nothing_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        merge_partial_attention([])
