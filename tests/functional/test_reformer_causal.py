"""The causal form of Reformer LSH attention: the same-bucket sliding window of the sorted
order (each query reads the ``2m − 1`` most recent earlier keys of its own bucket), which
depends on no later token; one bucket and a window covering the sequence give causal softmax
over the earlier tokens. The chunked path against the reference, causal included, is tested
in ``tests/attention/test_reformer.py``."""

from __future__ import annotations

import math

import pytest
import torch

from kattn.functional import (
    lsh_buckets,
    reformer_attention,
    reformer_attention_reference,
    reformer_num_buckets,
)

from ..attention.reformer_cases import H
from ..attention.reformer_cases import rotations as _rotations
from ..helpers import assert_close, padding_mask, qkv


def _window_rule(q, k, v, rotations, *, m, pad, shared_qk):
    """The causal rule pair by pair: query i (not padded) reads key j when j < i, j is not
    padded, h(q_i) = h(k_j) in some round, and at most ``2m − 1`` real keys of that bucket
    lie in positions j … i − 1; one softmax over the union of the rounds; the own value
    (zero for padding) when the union is empty."""
    hq = lsh_buckets(q, rotations)
    hk = hq if shared_qk else lsh_buckets(k, rotations)
    keys = q / q.norm(dim=-1, keepdim=True) if shared_qk else k
    b_, h_, length, d = q.shape
    out = torch.zeros(b_, h_, length, v.shape[-1], dtype=torch.float64)
    for b in range(b_):
        p = pad[b].tolist()
        for h in range(h_):
            for i in range(length):
                union = set()
                for r in range(rotations.shape[2]):
                    bucket = [j for j in range(i) if not p[j] and hk[b, h, r, j] == hq[b, h, r, i]]
                    if not p[i]:
                        union.update(bucket[-(2 * m - 1) :])
                if not union:
                    out[b, h, i] = 0.0 if p[i] else v[b, h, i]
                    continue
                js = sorted(union)
                logits = torch.stack([q[b, h, i] @ keys[b, h, j] for j in js]) / math.sqrt(d)
                out[b, h, i] = torch.softmax(logits, 0) @ v[b, h, js]
    return out


@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_the_causal_reference_is_the_window_rule_pair_by_pair(shared_qk):
    q, k, v = qkv(2, H, 29, dv=3)
    pad = padding_mask(2, 29, (0, 6))
    rot = _rotations(29, 3, 3)
    kw = {"causal": True, "key_padding_mask": pad, "shared_qk": shared_qk}
    ref = reformer_attention_reference(q, k, v, rot, bucket_size=3, **kw)
    assert_close(ref, _window_rule(q, k, v, rot, m=3, pad=pad, shared_qk=shared_qk))


@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_no_earlier_output_depends_on_a_later_token(shared_qk):
    """L = 8 chunks, 3 rounds: q, k and v after position t redrawn (their buckets too), the
    outputs at positions <= t are the same to 1e-12 (the same keys, summed in an order that
    may differ: their slots move with the later tokens), for several t."""
    m, length = 8, 64
    q, k, v = qkv(2, H, length, dv=4)
    rot = _rotations(length, m, 3)
    kw = {"bucket_size": m, "causal": True, "shared_qk": shared_qk}
    out = reformer_attention(q, k, v, rot, **kw)
    g = torch.Generator().manual_seed(11)
    for t in (5, 20, 37, 50):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, :, t + 1 :] = 3 * torch.randn(x[:, :, t + 1 :].shape, generator=g).double()
        out2 = reformer_attention(q2, k2, v2, rot, **kw)
        torch.testing.assert_close(out2[:, :, : t + 1], out[:, :, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out2[:, :, t + 1 :], out[:, :, t + 1 :])


@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_one_bucket_and_a_wide_window_is_causal_softmax_over_earlier_tokens(shared_qk):
    """Zero rotations put every token in bucket 0; with 2m − 1 >= L every earlier key is in
    the window: softmax over j < i, the first token reading its own value."""
    length, m = 40, 24
    q, k, v = qkv(2, H, length, dv=6)
    rot = torch.zeros(H, 16, 2, reformer_num_buckets(length, m) // 2, dtype=torch.float64)
    assert int(lsh_buckets(q, rot).max()) == 0
    out = reformer_attention(q, k, v, rot, bucket_size=m, causal=True, shared_qk=shared_qk)
    keys = q / q.norm(dim=-1, keepdim=True) if shared_qk else k
    logits = (q @ keys.transpose(-1, -2)) / 4.0
    earlier = torch.ones(length, length, dtype=torch.bool).tril(-1)
    expected = torch.softmax(logits.masked_fill(~earlier, -math.inf)[:, :, 1:], dim=-1) @ v
    assert_close(out[:, :, 1:], expected)
    assert_close(out[:, :, 0], v[:, :, 0])
    kw = {"bucket_size": m, "causal": True, "shared_qk": shared_qk}
    assert_close(reformer_attention_reference(q, k, v, rot, **kw), out)
