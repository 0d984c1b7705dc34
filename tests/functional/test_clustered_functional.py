"""Clustered attention maths: the hash, Hamming k-means against a loop-by-loop form of the
released algorithm, the initial centroids, the fast paths against the dense references
(forward and gradients, float64) and the paper's bound on the improved form's error."""

from __future__ import annotations

import pytest
import torch

from kattn.functional import (
    cluster_centroids,
    cluster_queries,
    clustered_attention,
    clustered_attention_reference,
    hamming_kmeans,
    hash_queries,
    improved_clustered_attention,
    improved_clustered_attention_reference,
    softmax_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv

H = 2


def _codes_to_ints(codes: torch.Tensor) -> list:
    """±1 codes ``(..., R)`` as nested lists of ints (bit r set where code r is +1)."""
    bits = (codes > 0).long()
    weights = 2 ** torch.arange(codes.shape[-1])
    return (bits * weights).sum(-1).tolist()


def _kmeans_loops(hashes, init, spare, iterations, valid):
    """Lloyd's iterations on int codes of one sequence and head, written out as the released
    C++ does: nearest centroid by popcount (first on ties), majority bits of the unpadded
    members (0 on a tie), a spare code for an empty cluster."""
    bits = max(len(bin(x)) for x in [*hashes, *init, *[s for row in spare for s in row], 1])

    def assign(cents):
        return [
            min(range(len(cents)), key=lambda c: (bin(x ^ cents[c]).count("1"), c)) for x in hashes
        ]

    cents = list(init)
    for t in range(iterations - 1):
        groups = assign(cents)
        new = []
        for c in range(len(cents)):
            members = [x for x, g, ok in zip(hashes, groups, valid, strict=True) if g == c and ok]
            if not members:
                new.append(spare[t][c])
                continue
            votes = [sum(1 if (x >> r) & 1 else -1 for x in members) for r in range(bits)]
            new.append(sum(1 << r for r, vote in enumerate(votes) if vote > 0))
        cents = new
    return assign(cents)


def _signs(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, shape, generator=g) * 2 - 1).double()


@pytest.mark.parametrize(
    ("length", "clusters", "bits", "iterations", "pads"),
    [(23, 4, 8, 5, (0, 5)), (31, 6, 5, 10, (3, 0)), (17, 3, 12, 1, (0, 0)), (12, 7, 3, 4, (2, 9))],
    ids=["r8-c4", "r5-c6-few-bits", "one-iteration", "many-clusters"],
)
def test_hamming_kmeans_is_the_released_lloyd_iteration(length, clusters, bits, iterations, pads):
    """Few bits make ties, repeated codes and empty clusters common: all must follow the
    released rules exactly."""
    codes = _signs(2, H, length, bits, seed=1)
    init = _signs(2, H, clusters, bits, seed=2)
    spare = _signs(max(iterations - 1, 0), 1, H, clusters, bits, seed=3)
    valid = ~padding_mask(2, length, pads)
    got = hamming_kmeans(codes, init, spare, iterations=iterations, valid=valid)
    assert got.shape == (2, H, length) and got.dtype == torch.int64
    for b in range(2):
        for h in range(H):
            expected = _kmeans_loops(
                _codes_to_ints(codes[b, h]),
                _codes_to_ints(init[b, h]),
                [_codes_to_ints(spare[t, 0, h]) for t in range(iterations - 1)],
                iterations,
                valid[b].tolist(),
            )
            assert got[b, h].tolist() == expected


def test_hash_bits_are_the_side_of_each_hyperplane():
    q = qkv(2, H, 9)[0]
    planes = torch.randn(7, 17, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    codes = hash_queries(q, planes)
    assert codes.shape == (2, H, 9, 7)
    for r in range(7):
        side = q @ planes[r, :16] > planes[r, 16]
        assert torch.equal(codes[..., r] > 0, side)
    a, b = _codes_to_ints(codes[0, 0, 0]), _codes_to_ints(codes[0, 0, 1])
    assert 7 - (codes[0, 0, 0] @ codes[0, 0, 1]) == 2 * bin(a ^ b).count("1")


def test_initial_centroids_are_distinct_unpadded_queries():
    """With as many clusters as unpadded queries and one assignment, each unpadded query is
    its own centroid's nearest query, so they land in distinct clusters; padded queries
    (whatever their values) neither take a slot nor change the others' clusters."""
    q = qkv(2, H, 30, d=8)[0]
    mask = padding_mask(2, 30, (6, 0))
    gen = lambda: torch.Generator().manual_seed(4)  # noqa: E731
    kw = {"num_clusters": 24, "bits": 40, "iterations": 1, "query_padding_mask": mask}
    got = cluster_queries(q, generator=gen(), **kw)
    assert got[0, :, :24].sort(dim=-1).values.tolist() == [list(range(24))] * H
    q2 = q.clone()
    q2[0, :, 24:] = 50 * torch.randn(H, 6, 8, generator=torch.Generator().manual_seed(5))
    again = cluster_queries(q2, generator=gen(), **(kw | {"iterations": 6}))
    assert torch.equal(
        again[0, :, :24], cluster_queries(q, generator=gen(), **(kw | {"iterations": 6}))[0, :, :24]
    )


def test_each_sequence_is_clustered_alone():
    q = qkv(3, H, 26)[0]
    mask = padding_mask(3, 26, (0, 7, 3))
    kw = {"num_clusters": 5, "bits": 16, "iterations": 6}
    whole = cluster_queries(
        q, generator=torch.Generator().manual_seed(1), query_padding_mask=mask, **kw
    )
    for b in range(3):
        one = cluster_queries(
            q[b : b + 1],
            generator=torch.Generator().manual_seed(1),
            query_padding_mask=mask[b : b + 1],
            **kw,
        )
        assert torch.equal(one, whole[b : b + 1])


def test_centroids_are_the_means_of_the_unpadded_members():
    q = qkv(1, 1, 6, d=3)[0]
    assignment = torch.tensor([[[0, 2, 0, 2, 2, 0]]])
    mask = torch.tensor([[False, False, False, False, True, True]])
    got = cluster_centroids(q, assignment, 4, mask)
    expected = torch.stack(
        [q[0, 0, [0, 2]].mean(0), torch.zeros(3), q[0, 0, [1, 3]].mean(0), torch.zeros(3)]
    )
    assert_close(got[0, 0], expected.double())


#: (Lq, Lk, clusters, topk, pads): lengths that clusters do not divide, cross-attention
#: (then the padding is on the keys only), topk above the unpadded key count, one cluster.
CASES = {
    "self-c5-k7": (37, 37, 5, 7, (0, 0)),
    "self-padded-c4-k6": (33, 33, 4, 6, (5, 11)),
    "cross-c6-k9": (19, 41, 6, 9, (0, 13)),
    "topk-over-unpadded": (21, 21, 3, 17, (2, 8)),
    "one-cluster": (15, 15, 1, 4, (0, 3)),
}


def _case(name, requires_grad=True):
    lq, lk, clusters, topk, pads = CASES[name]
    q, k, v = qkv(2, H, lq, lk, requires_grad=requires_grad, seed=7)
    kpm = padding_mask(2, lk, pads) if any(pads) else None
    qpm = kpm if lq == lk else None
    assignment = cluster_queries(
        q,
        num_clusters=clusters,
        bits=32,
        iterations=5,
        generator=torch.Generator().manual_seed(2),
        query_padding_mask=qpm,
    )
    kw = {"num_clusters": clusters, "key_padding_mask": kpm, "query_padding_mask": qpm}
    return q, k, v, assignment, kw, topk


def _poisoned(k, v, kpm):
    """k, v with NaN / inf in the padded positions (they must reach nothing)."""
    if kpm is None:
        return k, v
    where = kpm[:, None, :, None]
    return torch.where(where, torch.nan, k), torch.where(where, -torch.inf, v)


@pytest.mark.parametrize("improved", [False, True], ids=["clustered", "improved"])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_equals_the_dense_reference(case, improved):
    q, k, v, assignment, kw, topk = _case(case)
    if improved:
        fast_fn, ref_fn, kw = (
            improved_clustered_attention,
            improved_clustered_attention_reference,
            kw | {"topk": topk},
        )
    else:
        fast_fn, ref_fn = clustered_attention, clustered_attention_reference
    kp, vp = _poisoned(k, v, kw["key_padding_mask"])
    fast = fast_fn(q, kp, vp, assignment, **kw)
    ref = ref_fn(q, k, v, assignment, **kw)
    assert fast.shape == ref.shape == v.shape[:2] + q.shape[2:3] + v.shape[3:]
    assert torch.isfinite(fast).all()
    assert_close(fast, ref)
    g_fast, g_ref = grads(fast, q, k, v), grads(ref, q, k, v)
    for name, a, b in zip("qkv", g_fast, g_ref, strict=True):
        assert a is not None and torch.isfinite(a).all(), name
        assert_close(a, b)
    if kw["key_padding_mask"] is not None:  # no gradient reaches a padded key or value
        pad = kw["key_padding_mask"][:, None, :, None]
        assert (g_fast[1].masked_select(pad) == 0).all() and (
            g_fast[2].masked_select(pad) == 0
        ).all()


def test_every_query_its_own_cluster_and_topk_over_all_keys_are_exact_softmax():
    q, k, v = qkv(2, H, 13, 29)
    own = torch.arange(13).expand(2, H, 13)
    exact = softmax_attention_reference(q, k, v)
    assert_close(clustered_attention(q, k, v, own, num_clusters=13), exact)
    random_clusters = torch.randint(0, 3, (2, H, 13), generator=torch.Generator().manual_seed(0))
    improved = improved_clustered_attention(q, k, v, random_clusters, num_clusters=3, topk=29)
    assert_close(improved, exact)
    assert not torch.allclose(clustered_attention(q, k, v, random_clusters, num_clusters=3), exact)


def test_improved_weights_are_closer_to_softmax_than_clustered_ones():
    """Vyas et al. 2020, Proposition 2: ‖A^t_i − A_i‖₁ ≤ ‖A^c_i − A_i‖₁ for every query
    (the weight rows are read off by taking the identity as values)."""
    lk = 40
    q, k, _ = qkv(2, H, 50, lk, scale=1.5, seed=3)
    eye = torch.eye(lk, dtype=torch.float64).expand(2, H, lk, lk)
    exact = softmax_attention_reference(q, k, eye)
    assignment = cluster_queries(
        q, num_clusters=6, bits=20, generator=torch.Generator().manual_seed(1)
    )
    for topk in (1, 5, 20):
        clustered = clustered_attention_reference(q, k, eye, assignment, num_clusters=6)
        improved = improved_clustered_attention_reference(
            q, k, eye, assignment, num_clusters=6, topk=topk
        )
        assert_close(improved.sum(-1), torch.ones(2, H, 50, dtype=torch.float64))
        err_c = (clustered - exact).abs().sum(-1)
        err_i = (improved - exact).abs().sum(-1)
        assert (err_i <= err_c + 1e-12).all()
        if topk == 1:  # one key: its own softmax weight is 1, so A^t = A^c
            assert_close(improved, clustered)
        else:  # strictly better for most queries
            assert (err_i < err_c - 1e-6).float().mean() > 0.5


def test_a_sequence_with_every_key_padded_gives_zeros_and_finite_gradients():
    q, k, v = qkv(2, H, 11, requires_grad=True)
    mask = padding_mask(2, 11, (0, 11))
    assignment = torch.randint(0, 3, (2, H, 11), generator=torch.Generator().manual_seed(0))
    for fn, extra in ((clustered_attention, {}), (improved_clustered_attention, {"topk": 4})):
        out = fn(q, k, v, assignment, num_clusters=3, key_padding_mask=mask, **extra)
        assert (out[1] == 0).all() and torch.isfinite(out).all()
        assert all(torch.isfinite(g).all() for g in grads(out, q, k, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_inputs_are_summed_in_float32(dtype):
    q, k, v = (x.to(dtype) for x in qkv(2, H, 40, scale=3.0))
    assignment = cluster_queries(q, num_clusters=4, generator=torch.Generator().manual_seed(0))
    for fn, extra in ((clustered_attention, {}), (improved_clustered_attention, {"topk": 8})):
        out = fn(q, k, v, assignment, num_clusters=4, **extra)
        ref = fn(q.float(), k.float(), v.float(), assignment, num_clusters=4, **extra)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out.float(), ref, dtype)


def test_bad_sizes_raise_naming_them():
    q = qkv(1, 1, 5, d=4)[0]
    for kwargs, name in (
        ({"num_clusters": 0}, "num_clusters"),
        ({"num_clusters": 2, "bits": 0}, "bits"),
        ({"num_clusters": 2, "iterations": 0}, "iterations"),
    ):
        with pytest.raises(ValueError, match=name):
            cluster_queries(q, **kwargs)
    with pytest.raises(ValueError, match="topk"):
        improved_clustered_attention(
            q, q, q, torch.zeros(1, 1, 5, dtype=torch.long), num_clusters=1, topk=0
        )
