"""Reformer LSH attention: the hash, the dense reference against a pair-by-pair construction
of the paper's rule, the chunked path against the reference (forward and gradients), the
self rule, shared QK, causality, padding, half precision and the option checks. The
seeded-draw contract is tested for every mechanism in ``test_seeded.py``."""

from __future__ import annotations

import math

import pytest
import torch

import kattn
from kattn.functional import (
    lsh,
    lsh_buckets,
    reformer_attention,
    reformer_attention_reference,
    reformer_chunks,
    reformer_num_buckets,
)

from ..helpers import assert_close, grads, padding_mask, qkv
from .reformer_cases import MODES, H, assert_matches_reference, split_slices
from .reformer_cases import rotations as _rotations


def _build(**options) -> kattn.Attention:
    """The reformer module with head dim 16 and H heads, in float64 and evaluation mode."""
    return kattn.build("reformer", head_dim=16, num_heads=H, **options).double().eval()


def _brute_force(q, k, v, rotations, *, m, pad, shared_qk, across):
    """The paper's rule pair by pair (the non-causal form; the causal form, a same-bucket
    sliding window, has its own pairwise test among the functional tests): per round, sort by
    (bucket, position) with padded positions last, chunk of m, keys of the own and the
    previous chunk (the same bucket unless ``across``), not itself, not padded; one softmax
    over the union of the rounds with each key once; the own value when the union is empty
    (zero for a padded query, which reads nothing)."""
    hq = lsh_buckets(q, rotations)
    hk = hq if shared_qk else lsh_buckets(k, rotations)
    keys = q / q.norm(dim=-1, keepdim=True) if shared_qk else k
    b_, h_, length, d = q.shape
    out = torch.zeros(b_, h_, length, v.shape[-1], dtype=torch.float64)
    for b in range(b_):
        p = pad[b].tolist()
        for h in range(h_):
            cq, ck = [], []  # per round: position -> chunk of its sorted slot
            for r in range(rotations.shape[2]):
                for hashes, chunk_of in ((hq, cq), (hk, ck)):
                    sort_key = [
                        (p[i], 0 if p[i] else int(hashes[b, h, r, i]), i) for i in range(length)
                    ]
                    order = sorted(range(length), key=sort_key.__getitem__)
                    chunk_of.append({pos: slot // m for slot, pos in enumerate(order)})
            for i in range(length):
                if p[i]:  # a padded query reads nothing
                    continue
                union = set()
                for r in range(rotations.shape[2]):
                    for j in range(length):
                        if p[j] or j == i:
                            continue
                        if not across and hq[b, h, r, i] != hk[b, h, r, j]:
                            continue
                        if ck[r][j] in (cq[r][i] - 1, cq[r][i]):
                            union.add(j)
                if not union:
                    out[b, h, i] = 0.0 if p[i] else v[b, h, i]
                    continue
                js = sorted(union)
                logits = torch.stack([q[b, h, i] @ keys[b, h, j] for j in js]) / math.sqrt(d)
                out[b, h, i] = torch.softmax(logits, 0) @ v[b, h, js]
    return out


def test_the_hash_is_the_argmax_over_the_rotations_and_their_negations():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, H, 300, 16, generator=g, dtype=torch.float64)
    rot = torch.randn(H, 16, 3, 5, generator=g, dtype=torch.float64)
    proj = torch.einsum("bhld,hdrn->bhrln", x, rot)
    expected = torch.cat([proj, -proj], dim=-1).argmax(dim=-1)
    assert torch.equal(lsh_buckets(x, rot), expected)
    assert torch.equal(lsh_buckets(3.5 * x, rot), expected)  # angular: scale-free
    assert lsh_buckets(x, rot).unique().numel() == 10
    ties = torch.ones(1, 1, 4, 2, dtype=torch.float64)  # xR = (2, 2): the first maximum
    assert (
        lsh_buckets(ties, torch.ones(1, 2, 1, 2, dtype=torch.float64)).flatten().tolist() == [0] * 4
    )


def test_the_hash_in_float32_over_many_slices_with_shared_rotations(monkeypatch):
    # 2,000 positions × 2 heads × 2 rounds × 64 directions, hashed 64 positions at a time
    monkeypatch.setattr(lsh, "_HASH_ELEMENTS", 64 * 2 * 2 * 64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 2000, 32, generator=g)
    rot = torch.randn(1, 32, 2, 64, generator=g)  # one set for every head
    proj = torch.einsum("bhld,hdrn->bhrln", x.double(), rot.double())
    expected = torch.cat([proj, -proj], dim=-1).argmax(dim=-1)
    got = lsh_buckets(x, rot)
    assert got.shape == (1, 2, 2, 2000) and got.dtype == torch.long
    assert torch.equal(got, expected)


def test_without_grad_mode_the_pass_keeps_nothing_for_a_backward(monkeypatch):
    """Under no_grad, inputs that require grad give the same output and the probabilities
    are computed in place (no kept buffer: the softmax writes over the scores)."""
    q, k, v = qkv(2, H, 40, requires_grad=True)
    rot = _rotations(40, 4, 2)
    written_over = []
    softmax = reformer_chunks._softmax

    def spy(scores, out):
        written_over.append(out is scores)
        return softmax(scores, out)

    monkeypatch.setattr(reformer_chunks, "_softmax", spy)
    with torch.no_grad():
        out = reformer_attention(q, k, v, rot, bucket_size=4)
    assert written_over and all(written_over)
    written_over.clear()
    assert_close(reformer_attention(q, k, v, rot, bucket_size=4), out)
    assert written_over and not any(written_over)  # with a graph: kept for the backward


def test_the_number_of_buckets_gives_chunks_twice_the_mean_bucket():
    assert reformer_num_buckets(4096, 64) == 128  # m = 2l/n_buckets
    assert reformer_num_buckets(100, 64) == 4
    assert reformer_num_buckets(10, 64) == 2
    attn = kattn.build("reformer", head_dim=16, num_heads=H)
    assert attn.rotations(1000).shape == (H, 16, 2, 16)  # 2 rounds, nb/2 = ⌈1000/64⌉
    rot = attn.rotations(1000)
    assert not torch.equal(rot[0], rot[1])  # a draw per head
    # a fixed count per module: num_buckets, else from max_len, else (only then) from L
    assert [attn.buckets(n) for n in (10, 100, 1000)] == [2, 4, 32]
    fixed = kattn.build("reformer", head_dim=16, num_heads=H, max_len=1000)
    assert [fixed.buckets(n) for n in (10, 100, 1000)] == [32] * 3
    assert torch.equal(fixed.rotations(10), fixed.rotations(1000))
    given = kattn.build("reformer", head_dim=16, num_heads=H, max_len=1000, num_buckets=6)
    assert given.buckets(10) == 6 and given.rotations(700).shape == (H, 16, 2, 3)


@pytest.mark.parametrize("mode", list(MODES))
def test_the_reference_is_the_papers_rule_pair_by_pair(mode):
    shared_qk, across = MODES[mode]
    q, k, v = qkv(2, H, 23, dv=3)
    pad = padding_mask(2, 23, (0, 5))
    rot = _rotations(23, 4, 3)
    kw = {"key_padding_mask": pad, "shared_qk": shared_qk}
    ref = reformer_attention_reference(
        q, k, v, rot, bucket_size=4, attend_across_buckets=across, **kw
    )
    brute = _brute_force(q, k, v, rot, m=4, pad=pad, shared_qk=shared_qk, across=across)
    assert_close(ref, brute)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", list(MODES))
def test_the_chunked_path_equals_the_reference(mode, causal, split, monkeypatch):
    """L = 61 with chunks of 4 (a partial last chunk), 3 rounds, right and left padding with
    NaN and inf in the padded keys and values; forward and every gradient. ``split``: one
    (batch, head) sequence per slice and one block per group, so that slices and groups have
    boundaries."""
    if split:
        split_slices(monkeypatch)
    shared_qk, across = MODES[mode]
    q, k, v = qkv(3, H, 61, dv=5, requires_grad=True)
    pad = padding_mask(3, 61, (0, 13, 0))
    pad[2, :9] = True
    rot = _rotations(61, 4, 3)
    kw = {"bucket_size": 4, "causal": causal, "key_padding_mask": pad}
    kw |= {"shared_qk": shared_qk, "attend_across_buckets": across}
    out = assert_matches_reference(q, k, v, rot, **kw)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[pad[:, None, :, None].expand_as(k2)] = float("nan")
    v2[pad[:, None, :, None].expand_as(v2)] = float("inf")
    out2 = reformer_attention(q.detach(), k2, v2, rot, **kw)
    assert torch.isfinite(out2).all()
    assert_close(out2, out.detach())


def test_the_module_path_equals_its_reference_and_its_rotations():
    attn = _build(bucket_size=8, num_hashes=3)
    q, k, v = qkv(2, H, 70, requires_grad=True)
    pad = padding_mask(2, 70, (3, 0))
    out = attn(q, k, v, causal=True, key_padding_mask=pad)
    ref = attn.reference(q, k, v, causal=True, key_padding_mask=pad)
    assert_close(out, ref)
    rot, factors = attn.rotations(70), attn.bucket_factors(70)
    assert factors == (4, 6)  # 2·⌈70/8⌉ = 18 buckets > 2·max(3, 8): two hashes, 24 buckets
    assert rot.shape == (H, 16, 3, 5)
    by_hand = reformer_attention_reference(
        q, k, v, rot, bucket_size=8, causal=True, key_padding_mask=pad, bucket_factors=factors
    )
    assert_close(ref, by_hand)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


def test_one_chunk_is_softmax_over_every_other_token():
    """L <= bucket_size: a single chunk, so each query reads every key but itself (counted
    once however many rounds hold it), the keys being the unit-normalised queries."""
    attn = _build(num_hashes=4)
    q, k, v = qkv(1, H, 40)
    keys = q / q.norm(dim=-1, keepdim=True)
    logits = (q @ keys.transpose(-1, -2)) / 4.0
    logits = logits.masked_fill(torch.eye(40, dtype=torch.bool), -math.inf)
    assert_close(attn(q, k, v), torch.softmax(logits, dim=-1) @ v)


def test_a_token_reads_itself_only_when_nothing_else_is_available():
    attn = _build(bucket_size=4)
    q, k, v = qkv(1, H, 30)
    out = attn(q, k, v, causal=True)
    assert_close(out[:, :, 0], v[:, :, 0])  # the first causal token: itself only
    pad = padding_mask(1, 30, (29,))  # one real key: token 0 has no other key
    out = attn(q, k, v, key_padding_mask=pad)
    assert_close(out[:, :, 0], v[:, :, 0])
    one = torch.ones(1, H, 2, 16, dtype=torch.float64)  # two tokens: each reads the other
    values = torch.tensor([[1.0], [2.0]], dtype=torch.float64).expand(1, H, 2, 1)
    assert attn(one, one, values).flatten().tolist() == [2.0, 1.0] * H


def test_shared_qk_does_not_read_k_and_gives_it_zero_gradient():
    attn = _build(bucket_size=8)
    q, k, v = qkv(2, H, 50, requires_grad=True)
    other = qkv(2, H, 50, seed=9)[1]
    out = attn(q, k, v)
    assert_close(attn(q, other, v), out)
    (out**2).sum().backward()
    assert k.grad is not None and torch.equal(k.grad, torch.zeros_like(k))
    separate = _build(bucket_size=8, shared_qk=False)
    assert not torch.allclose(separate(q, k, v), separate(q, other, v))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_zero_query_row_with_shared_qk_has_a_finite_gradient(causal, monkeypatch):
    """x/‖x‖ has no derivative at 0: the unit key of a zero row stays zero with a zero
    gradient (a division by the clamped norm gave ~1e307 in float64), on both paths."""
    split_slices(monkeypatch)
    q, _, v = qkv(1, H, 40, d=16, requires_grad=True)
    with torch.no_grad():
        q[0, :, 3] = 0.0
    options = {"bucket_size": 4, "causal": causal}
    assert_matches_reference(q, q, v, _rotations(40, 4, 2), **options)
    out = reformer_attention(q, q, v, _rotations(40, 4, 2), **options)
    (gq,) = grads(out, q)
    assert torch.isfinite(out).all() and gq.abs().max() < 100.0


@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_causal_outputs_never_read_later_keys_or_values(shared_qk):
    """Later queries, keys and values redrawn (their buckets too, over 11 chunks): earlier
    outputs stay the same, the causal form's keys being the most recent earlier ones of
    the query's bucket."""
    attn = _build(bucket_size=4, shared_qk=shared_qk)
    q, k, v = qkv(2, H, 45)
    out = attn(q, k, v, causal=True)
    cut = 20
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    g = torch.Generator().manual_seed(4)
    for x in (q2, k2, v2):
        x[:, :, cut:] = 5 * torch.randn(x[:, :, cut:].shape, generator=g, dtype=x.dtype)
    out2 = attn(q2, k2, v2, causal=True)
    assert_close(out2[:, :, :cut], out[:, :, :cut])
    assert not torch.allclose(out2[:, :, cut:], out[:, :, cut:])


FIXED = {"max_len": {"max_len": 64}, "num_buckets": {"num_buckets": 10}}


@pytest.mark.parametrize("fixed", list(FIXED))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_an_example_alone_equals_it_right_padded_in_a_longer_batch(shared_qk, causal, fixed):
    """With a fixed number of buckets a token's bucket depends only on the token, so the
    real tokens' sorted order and chunks are those of the example alone: example 0 (37
    tokens) alone equals it padded to 53 (NaN in its padded keys and values) beside a
    53-token example, 3 rounds and chunks of 4 (partial last chunks)."""
    attn = _build(bucket_size=4, num_hashes=3, shared_qk=shared_qk, **FIXED[fixed])
    q, k, v = qkv(2, H, 53)
    pad = padding_mask(2, 53, (16, 0))
    k, v = k.clone(), v.clone()
    k[0, :, 37:], v[0, :, 37:] = float("nan"), float("nan")
    batch = attn(q, k, v, causal=causal, key_padding_mask=pad)
    alone = attn(q[:1, :, :37], k[:1, :, :37], v[:1, :, :37], causal=causal)
    assert torch.isfinite(batch).all()
    assert_close(batch[:1, :, :37], alone)
    assert_close(attn.reference(q, k, v, causal=causal, key_padding_mask=pad), batch)
    free = _build(bucket_size=4, num_hashes=3)  # nb from each call's L: the documented dependence
    assert free.buckets(37) != free.buckets(53)


@pytest.mark.parametrize("shared_qk", [True, False], ids=["shared", "separate"])
def test_a_causal_prefix_run_equals_the_full_run_on_the_prefix(shared_qk):
    """max_len fixes nb, so the first 29 tokens run alone give the outputs of the full
    61-token run at those positions (chunks of 4, 3 rounds): no later token moves a bucket,
    a chunk or a window."""
    attn = _build(bucket_size=4, num_hashes=3, shared_qk=shared_qk, max_len=64)
    q, k, v = qkv(2, H, 61)
    full = attn(q, k, v, causal=True)
    prefix = attn(q[:, :, :29], k[:, :, :29], v[:, :, :29], causal=True)
    assert_close(prefix, full[:, :, :29])


def test_padded_positions_count_nowhere_even_as_queries_in_the_sort():
    """Padded queries and keys changed at will (new buckets included): the real outputs
    are the same, since padded positions are sorted after the real ones."""
    attn = _build(bucket_size=4, shared_qk=False)
    q, k, v = qkv(2, H, 37)
    pad = padding_mask(2, 37, (6, 11))
    out = attn(q, k, v, key_padding_mask=pad)
    where = pad[:, None, :, None]
    g = torch.Generator().manual_seed(3)
    q2, k2, v2 = (
        torch.where(where, 30 * torch.randn(x.shape, generator=g, dtype=x.dtype), x)
        for x in (q, k, v)
    )
    out2 = attn(q2, k2, v2, key_padding_mask=pad)
    for row in range(2):
        keep = ~pad[row]
        assert_close(out2[row][:, keep], out[row][:, keep])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_in_padded_queries_reaches_no_real_output_or_gradient_with_shared_qk(causal):
    """With shared QK the keys are q's rows: NaN in padded rows of q changes neither the real
    positions' outputs nor the gradients of the real rows of q and v."""
    attn = _build(bucket_size=4)
    pad = padding_mask(2, 29, (0, 7))
    where = pad[:, None, :, None]
    results = []
    for fill in (0.0, float("nan")):
        q, k, v = qkv(2, H, 29)
        q = q.masked_fill(where, fill).requires_grad_()
        v.requires_grad_()
        out = attn(q, k, v, causal=causal, key_padding_mask=pad)
        real = out.masked_fill(where, 0.0)  # the loss reads the real positions only
        results.append((real, *grads(real, q, v)))
    for clean, dirty in zip(*results, strict=True):
        assert_close(dirty.masked_fill(where, 0.0), clean.masked_fill(where, 0.0))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_fully_padded_sequence_gives_zeros_and_finite_gradients(causal):
    attn = _build(bucket_size=4)
    q, k, v = qkv(2, H, 21, requires_grad=True)
    pad = padding_mask(2, 21, (0, 21))
    out = attn(q, k, v, causal=causal, key_padding_mask=pad)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=pad)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g).all()
        assert_close(g, g_ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_inputs_give_a_close_output_in_their_dtype(dtype):
    attn = kattn.build("reformer", head_dim=16, num_heads=H, bucket_size=8).eval()
    q, k, v = (x.to(dtype) for x in qkv(2, H, 90, dtype=torch.float32, scale=2.0))
    out = attn(q, k, v, causal=True)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = attn(q.float(), k.float(), v.float(), causal=True)
    assert (out.float() - ref).norm() / ref.norm() < 0.02


def test_options_and_refusals():
    attn = kattn.build("reformer", head_dim=16, num_heads=H, max_len=64)
    assert attn.bucket_size == 64 and attn.num_hashes == 2 and attn.shared_qk
    assert attn.attend_across_buckets and not attn.is_exact
    assert kattn.spec("reformer").supports_causal and not kattn.spec("reformer").supports_cross
    q, k, v = qkv(1, H, 10, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="Lq == Lk"):
        attn(q, k[:, :, :7], v[:, :, :7])
    with pytest.raises(NotImplementedError, match="recurrent"):
        attn.init_state(1, H)
    assert attn.num_buckets is None and attn.buckets(10) == 2  # 2·⌈64/64⌉ from max_len
    for bad in ({"bucket_size": 0}, {"num_hashes": 0}, {"num_buckets": 0}, {"num_buckets": 5}):
        with pytest.raises(ValueError):
            kattn.build("reformer", head_dim=16, num_heads=H, **bad)
    with pytest.raises(TypeError, match="shared_qk"):
        kattn.build("reformer", head_dim=16, num_heads=H, shared_qk=1)
    with pytest.raises(ValueError, match="rotations"):
        lsh_buckets(q, torch.randn(3, 16, 1, 2))
