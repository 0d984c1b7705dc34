"""SMYRF: the asymmetric transform, the hash orders and the balanced clusters against their
definitions, the clustered path against the dense reference (forward and gradients), the
reference against the per-round log-sum-exp merge, padding, cross-attention, half precision
and the option checks. The seeded-draw contract is tested for every mechanism in
``test_seeded.py``."""

from __future__ import annotations

import math

import pytest
import torch

import kattn
from kattn.functional import (
    SmyrfOrders,
    smyrf_attention,
    smyrf_attention_reference,
    smyrf_num_clusters,
    smyrf_orders,
    smyrf_pattern,
    smyrf_transform,
)

from ..helpers import assert_close, assert_half_mostly_close, grads, padding_mask, qkv

H, D = 2, 16


def _projections(rounds: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rounds, D + 2, generator=g, dtype=torch.float64)


def _build(seed: int = 0, **options) -> kattn.Attention:
    return kattn.build("smyrf", head_dim=D, num_heads=H, seed=seed, **options).double().eval()


def test_transform_turns_inner_products_into_distances():
    """‖F(q) − G(k)‖² = 2(M_Q² + M_K²) − 2 q·k, with the maxima over the real rows only."""
    q, k, _ = qkv(2, H, 23, scale=2.0)
    mask = padding_mask(2, 23, (0, 6))
    k[1, :, 17:] *= 100.0  # padded keys with huge norms must not set M_K
    q[1, :, 17:] *= 100.0  # nor padded queries M_Q (Lq == Lk: self-attention)
    fq, gk = smyrf_transform(q, k, key_padding_mask=mask)
    assert fq.shape == (2, H, 23, D + 2) and gk.shape == (2, H, 23, D + 2)
    for b, n in ((0, 23), (1, 17)):
        big = q[b, :, :n].norm(dim=-1).amax(-1) ** 2 + k[b, :, :n].norm(dim=-1).amax(-1) ** 2
        dist = torch.cdist(fq[b, :, :n], gk[b, :, :n]) ** 2
        expected = 2 * big[:, None, None] - 2 * q[b, :, :n] @ k[b, :, :n].transpose(-1, -2)
        assert_close(dist, expected)
    assert torch.equal(gk[1, :, 17:], torch.zeros_like(gk[1, :, 17:]))


def test_orders_sort_by_projection_with_padding_last():
    q, k, _ = qkv(2, H, 20, 20)
    mask = padding_mask(2, 20, (0, 5), left=True)
    a = _projections(3)
    orders = smyrf_orders(q, k, a, key_padding_mask=mask)
    fq, gk = smyrf_transform(q, k, key_padding_mask=mask)
    assert orders.num_queries.tolist() == [20, 15] and orders.num_keys.tolist() == [20, 15]
    for b in range(2):
        real = (~mask[b]).nonzero().flatten()
        for h in range(H):
            for r in range(3):
                hq = fq[b, h, real] @ a[r]
                hk = gk[b, h, real] @ a[r]
                n = len(real)
                assert orders.q_order[b, h, r, :n].tolist() == real[hq.argsort()].tolist()
                assert orders.k_order[b, h, r, :n].tolist() == real[hk.argsort()].tolist()
                padded = mask[b].nonzero().flatten().tolist()
                assert orders.q_order[b, h, r, n:].tolist() == padded
                assert orders.k_order[b, h, r, n:].tolist() == padded


def _expected_pattern(orders: SmyrfOrders, cluster_size: int) -> torch.Tensor:
    """C = ⌈max(nq, nk)/cluster_size⌉ clusters from each example's real counts; cluster c
    holds the sorted ranks [⌊c·n/C⌋, ⌊(c+1)·n/C⌋), a key cluster at least the rank ⌊c·n/C⌋
    when keys are fewer than clusters; entry by entry."""
    b_, h_, r_, lq = orders.q_order.shape
    lk = orders.k_order.shape[-1]
    allowed = torch.zeros(b_, h_, r_, lq, lk, dtype=torch.bool)
    for b in range(b_):
        nq, nk = int(orders.num_queries[b]), int(orders.num_keys[b])
        clusters = max(1, math.ceil(max(nq, nk) / cluster_size))
        for h in range(h_):
            for r in range(r_):
                qs, ks = orders.q_order[b, h, r].tolist(), orders.k_order[b, h, r].tolist()
                for c in range(clusters):
                    q_members = qs[c * nq // clusters : (c + 1) * nq // clusters]
                    lo, hi = c * nk // clusters, (c + 1) * nk // clusters
                    k_members = ks[lo : max(hi, min(lo + 1, nk))]
                    for i in q_members:
                        for j in k_members:
                            allowed[b, h, r, i, j] = True
    return allowed


#: (Lq, Lk, cluster_size, padding of the two examples): lengths the clusters do not divide,
#: cross-attention both ways, fewer real keys than clusters, one cluster (exact softmax).
CASES = {
    "self-37-c8": (37, 37, 8, (0, 9)),
    "self-50-c7": (50, 50, 7, (3, 0)),
    "cross-13x41-c5": (13, 41, 5, (0, 12)),
    "cross-41x13-c5": (41, 13, 5, (2, 0)),
    "few-keys": (30, 30, 4, (0, 25)),
    "one-cluster": (21, 21, 32, (0, 4)),
}
IDS = list(CASES)


@pytest.mark.parametrize("case", IDS)
def test_pattern_is_the_balanced_clusters(case):
    lq, lk, cs, pads = CASES[case]
    q, k, _ = qkv(2, H, lq, lk)
    mask = padding_mask(2, lk, pads)
    orders = smyrf_orders(q, k, _projections(2), key_padding_mask=mask)
    clusters = smyrf_num_clusters(orders.num_queries, orders.num_keys, cs)
    pattern = smyrf_pattern(orders, clusters)
    assert torch.equal(pattern, _expected_pattern(orders, cs))
    assert not pattern[1][..., lk - pads[1] :].any()  # padded keys are never read
    real_q = orders.num_queries.view(2, 1, 1)
    # every real query reads ⌊n_k/C⌋ or ⌈n_k/C⌉ keys (at least one)
    reads = pattern.sum(-1)
    for b in range(2):
        nk = int(orders.num_keys[b])
        clusters = max(1, -(-max(int(orders.num_queries[b]), nk) // cs))
        rows = reads[b][orders.q_order[b].argsort(-1) < real_q[b]]
        assert rows.min() >= max(1, nk // clusters) and rows.max() <= max(1, -(-nk // clusters))


def test_clusters_are_counted_from_the_real_lengths():
    assert smyrf_num_clusters(37, 50, 8) == 7 and smyrf_num_clusters(0, 0, 8) == 1
    counts = smyrf_num_clusters(torch.tensor([37, 13, 0]), torch.tensor([37, 41, 0]), 8)
    assert counts.tolist() == [5, 6, 1]


@pytest.mark.parametrize("case", IDS)
def test_forward_and_gradients_equal_the_reference(case):
    lq, lk, cs, pads = CASES[case]
    q, k, v = qkv(2, H, lq, lk, requires_grad=True)
    mask = padding_mask(2, lk, pads)
    a = _projections(3)
    out = smyrf_attention(q, k, v, a, cluster_size=cs, key_padding_mask=mask)
    ref = smyrf_attention_reference(q, k, v, a, cluster_size=cs, key_padding_mask=mask)
    assert out.shape == (2, H, lq, v.shape[-1])
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_reference_is_the_log_sum_exp_merge_of_the_rounds():
    """Per round: softmax over the keys of the query's cluster; rounds weighted by their
    normalisers e^{lse_r} (the released code's merge)."""
    q, k, v = qkv(1, H, 29)
    a = _projections(4)
    orders = smyrf_orders(q, k, a)
    pattern = smyrf_pattern(orders, smyrf_num_clusters(29, 29, 6))  # (1, H, R, L, L)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D))[:, :, None]
    masked = scores.masked_fill(~pattern, -math.inf)
    lse = masked.logsumexp(-1)  # (1, H, R, L)
    per_round = torch.softmax(masked, -1) @ v[:, :, None]
    weights = torch.softmax(lse, dim=2)[..., None]
    expected = (weights * per_round).sum(2)
    assert_close(smyrf_attention_reference(q, k, v, a, cluster_size=6), expected)
    assert_close(smyrf_attention(q, k, v, a, cluster_size=6), expected)


def test_one_cluster_is_exact_softmax():
    q, k, v = qkv(2, H, 30)
    out = _build(cluster_size=30)(q, k, v)
    assert_close(out, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v)


def _grouped(b: int, length: int, groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys scattered around ``groups`` shared centres (per example and head)."""
    g = torch.Generator().manual_seed(seed)
    centres = 2 * torch.randn(b, H, groups, D, generator=g, dtype=torch.float64)

    def around() -> torch.Tensor:
        label = torch.randint(groups, (b, H, length, 1), generator=g).expand(-1, -1, -1, D)
        noise = torch.randn(b, H, length, D, generator=g, dtype=torch.float64)
        return centres.gather(2, label) + 0.5 * noise

    return around(), around()


def test_clusters_hold_more_attention_mass_than_random_ones():
    """The asymmetric hashing groups each query with its large-inner-product keys: the softmax
    mass inside a query's cluster is well above that of random balanced clusters (1/C), and
    more rounds cover more of it."""
    q, k = _grouped(4, 256, 8, seed=11)
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1)
    orders = smyrf_orders(q, k, _projections(4))
    g = torch.Generator().manual_seed(0)
    perms = [torch.randperm(256, generator=g) for _ in range(2 * 4 * H)]
    shuffled = SmyrfOrders(
        torch.stack(perms[: 4 * H]).view(4, H, 1, 256),
        torch.stack(perms[4 * H :]).view(4, H, 1, 256),
        orders.num_queries,
        orders.num_keys,
    )
    pattern = smyrf_pattern(orders, 8)
    one_round = (probs * pattern[:, :, 0]).sum(-1).mean()
    four_rounds = (probs * pattern.any(2)).sum(-1).mean()
    random_mass = (probs * smyrf_pattern(shuffled, 8)[:, :, 0]).sum(-1).mean()
    assert abs(random_mass - 1 / 8) < 0.02
    assert one_round > 2.5 * random_mass, (one_round, random_mass)
    assert four_rounds > 1.5 * one_round, (four_rounds, one_round)


def test_module_equals_its_reference_and_padded_values_count_nowhere():
    attn = _build(num_hashes=3, cluster_size=6)
    q, k, v = qkv(2, H, 40, requires_grad=True)
    mask = padding_mask(2, 40, (0, 11))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g).all()
        assert_close(g, g_ref)
    q2, k2, v2 = (x.detach().clone() for x in (q, k, v))
    k2[1, :, 29:] = float("nan")
    v2[1, :, 29:] = float("nan")
    q2[1, :, 29:] = float("nan")  # padded queries of a self-attention
    out2 = attn(q2, k2, v2, key_padding_mask=mask)
    assert torch.isfinite(out2).all()
    assert_close(out2[:, :, :29], out[:, :, :29].detach())
    assert torch.equal(out2[1, :, 29:], torch.zeros_like(out2[1, :, 29:]))


def test_a_fully_padded_sequence_gives_zeros_and_finite_gradients():
    attn = _build(cluster_size=8)
    q, k, v = qkv(2, H, 33, 19, requires_grad=True)
    mask = padding_mask(2, 19, (0, 19))
    out = attn(q, k, v, key_padding_mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    for g in grads(out, q, k, v):
        assert torch.isfinite(g).all()


def test_causal_is_refused_with_a_reason():
    q, k, v = qkv(1, H, 20)
    with pytest.raises(NotImplementedError, match="later tokens"):
        _build()(q, k, v, causal=True)
    assert not kattn.spec("smyrf").supports_causal and kattn.spec("smyrf").supports_cross


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_finite_and_close(dtype):
    # rounding q and k can swap hash neighbours, so compare where the orders agree
    assert_half_mostly_close(_build(cluster_size=8).float(), dtype, H)


def test_functional_checks_the_projections():
    q, k, v = qkv(1, H, 10)
    with pytest.raises(ValueError, match=r"projections must be \(R, D \+ 2\)"):
        smyrf_attention(q, k, v, torch.randn(2, D), cluster_size=4)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_hashes": 0}, "num_hashes must be a positive int, got 0"),
        ({"cluster_size": 0}, "cluster_size must be a positive int, got 0"),
        ({"scale": 0.0}, "scale must be positive or None, got 0.0"),
    ],
)
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build("smyrf", head_dim=D, num_heads=H, **options)


#: (real lengths of the examples, Lq of a cross-attention or None, cluster_size): the padded
#: length of the batch would give another number of clusters than the real ones.
ALONE = {
    "self-c8": ((37, 52), None, 8),
    "self-short-c6": ((9, 70), None, 6),
    "self-c32": ((50, 64), None, 32),
    "cross-c5": ((12, 41), 23, 5),
}


@pytest.mark.parametrize("case", list(ALONE))
def test_an_example_alone_equals_it_right_padded_in_a_longer_batch(case):
    lengths, lq, cs = ALONE[case]
    attn = _build(num_hashes=2, cluster_size=cs)
    total = max(lengths) + 11
    q, k, v = qkv(len(lengths), H, lq or total, total)
    mask = padding_mask(len(lengths), total, tuple(total - n for n in lengths))
    out = attn(q, k, v, key_padding_mask=mask)
    for b, n in enumerate(lengths):
        rows = slice(b, b + 1)
        alone = attn(q[rows, :, : lq or n], k[rows, :, :n], v[rows, :, :n])
        assert_close(out[rows, :, : lq or n], alone)
