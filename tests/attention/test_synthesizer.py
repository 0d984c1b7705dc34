"""Synthesizer: every variant and mixture against the explicit reference (forward and
gradients), the synthetic logits against their definitions written out, the mixture's limits,
causality, padding, decoding step by step, fixed random tables, half precision and the option
checks."""

from __future__ import annotations

import itertools

import pytest
import torch

import kattn
from kattn.functional import (
    DenseWeights,
    dense_synthesizer_logits,
    factorized_dense_logits,
    factorized_dense_logits_reference,
    softmax_attention_reference,
)

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

H, MAX_LEN = 2, 48
VARIANTS = ["dense", "random", "factorized_dense", "factorized_random"]
CONFIGS = list(itertools.product(VARIANTS, ["none", "dot"]))
IDS = [f"{v}-{m}" for v, m in CONFIGS]


def _build(variant: str = "dense", mix: str = "none", **options) -> kattn.Attention:
    torch.manual_seed(0)
    attn = kattn.build(
        "synthesizer", head_dim=16, num_heads=H, max_len=MAX_LEN, variant=variant, mix=mix,
        **options,
    )  # fmt: skip
    with torch.no_grad():  # tables far from uniform attention, and a mixture away from 1/2
        for p in [*attn.parameters(), *attn.buffers()]:
            p.mul_(3.0)
        if mix == "dot":
            attn.mix_logit.copy_(torch.tensor([-0.7, 1.2]))
    return attn.double().eval()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("variant", "mix"), CONFIGS, ids=IDS)
def test_forward_and_gradients_equal_the_reference(variant, mix, causal):
    attn = _build(variant, mix)
    q, k, v = qkv(2, H, 37, requires_grad=True)
    mask = padding_mask(2, 37, (0, 6))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    tensors = [q, k, v, *attn.parameters()]
    for fast, slow in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        assert_close(fast, slow)


def test_dense_logits_are_the_per_token_network():
    g = torch.Generator().manual_seed(0)
    w = DenseWeights(
        *(torch.randn(*s, generator=g).double() for s in [(H, 4, 4), (H, 4), (H, 4, 9), (H, 9)])
    )
    q = torch.randn(1, H, 5, 4, generator=g).double()
    logits = dense_synthesizer_logits(q, w, 7)
    for h in range(H):
        for i in range(5):
            hidden = torch.relu(w.w1[h].T @ q[0, h, i] + w.b1[h])
            assert_close(logits[0, h, i], (w.w2[h].T @ hidden + w.b2[h])[:7])


def test_factorized_dense_logits_tile_a_and_repeat_b():
    """Logit j is A[j mod a] · B[⌊j/a⌋]: a = 3, b = 4 cover 12 positions, cut to 11."""
    g = torch.Generator().manual_seed(1)

    def weights(out):
        shapes = [(H, 4, 4), (H, 4), (H, 4, out), (H, out)]
        return DenseWeights(*(torch.randn(*s, generator=g).double() for s in shapes))

    first, second = weights(3), weights(4)
    q = torch.randn(2, H, 5, 4, generator=g).double()
    fast = factorized_dense_logits(q, first, second, 11)
    assert_close(fast, factorized_dense_logits_reference(q, first, second, 11))
    a = dense_synthesizer_logits(q, first, 3)
    b = dense_synthesizer_logits(q, second, 4)
    for j in range(11):
        assert_close(fast[..., j], a[..., j % 3] * b[..., j // 3])


def test_random_logits_are_the_table_and_its_factorisation():
    attn = _build("random")
    assert_close(attn.synthetic(torch.zeros(1, H, 5, 16).double(), 9)[0], attn.table[:, :5, :9])
    attn = _build("factorized_random", rank=3)
    assert attn.left.shape == (H, MAX_LEN, 3)
    expected = attn.left[:, 2:7] @ attn.right[:, :9].transpose(-1, -2)
    assert_close(attn.synthetic(torch.zeros(1, H, 5, 16).double(), 9, offset=2)[0], expected)


def test_the_mixture_spans_synthetic_and_dot_product_attention():
    q, k, v = qkv(2, H, 30)
    mixed, alone = _build("random", "dot"), _build("random")
    with torch.no_grad():
        mixed.mix_logit.fill_(60.0)  # α = 1: the synthetic logits alone
    assert_close(mixed(q, k, v, causal=True), alone(q, k, v, causal=True))
    with torch.no_grad():
        mixed.mix_logit.fill_(-60.0)  # α = 0: softmax attention
    assert_close(mixed(q, k, v, causal=True), softmax_attention_reference(q, k, v, causal=True))


@pytest.mark.parametrize(("variant", "mix"), CONFIGS, ids=IDS)
def test_causal_never_sees_the_future(variant, mix):
    attn = _build(variant, mix)
    q, k, v = qkv(1, H, 40)
    out = attn(q, k, v, causal=True)
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:
        x[:, :, 23:] = 1e2 * torch.randn_like(x[:, :, 23:])
    assert_close(attn(*changed, causal=True)[:, :, :23], out[:, :, :23])
    assert not torch.allclose(attn(*changed, causal=True)[:, :, 23:], out[:, :, 23:])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("variant", "mix"), CONFIGS, ids=IDS)
def test_padding_is_truncation(variant, mix, causal):
    """Padded keys count nowhere: 30 real tokens padded to 41 (with NaN and inf in the padding)
    give the outputs of the 30 tokens alone, and finite gradients."""
    attn = _build(variant, mix)
    q, k, v = qkv(1, H, 41)
    short = attn(q[:, :, :30], k[:, :, :30], v[:, :, :30], causal=causal)
    k2, v2 = k.clone().requires_grad_(), v.clone()
    with torch.no_grad():
        k2[:, :, 30:], v2[:, :, 30:] = float("nan"), float("inf")
    v2.requires_grad_()
    out = attn(q, k2, v2, causal=causal, key_padding_mask=padding_mask(1, 41, (11,)))
    assert_close(out[:, :, :30], short)
    for g in grads(out[:, :, :30], k2, v2):
        assert torch.isfinite(g).all()


@pytest.mark.parametrize(("variant", "mix"), CONFIGS, ids=IDS)
def test_decoding_step_by_step_equals_the_causal_forward(variant, mix):
    attn = _build(variant, mix)
    q, k, v = qkv(2, H, 29)
    expected = attn(q, k, v, causal=True)
    first, state = attn.prefill(q[:, :, :11], k[:, :, :11], v[:, :, :11])
    rest, state = step_through(attn.step, q, k, v, state, start=11)
    assert_close(torch.cat([first, rest], dim=2), expected)
    assert state.length == 29


def test_decoding_stops_at_max_len():
    attn = _build("random")
    q, k, v = qkv(1, H, MAX_LEN)
    _, state = attn.prefill(q, k, v)
    with pytest.raises(ValueError, match="max_len=48"):
        attn.step(q[:, :, :1], k[:, :, :1], v[:, :, :1], state)


def test_cross_attention_reads_the_leading_rows_and_columns():
    attn = _build("random")
    q, k, v = qkv(2, H, 13, 30)
    out = attn(q, k, v)
    weights = torch.softmax(attn.table[:, :13, :30], dim=-1)
    assert_close(out, weights @ v)
    with pytest.raises(ValueError, match="max_len=48"):
        attn(*qkv(1, H, 13, 49))


def test_fixed_random_tables_are_frozen_buffers_kept_in_the_state_dict():
    attn = _build("factorized_random", fixed_random=True)
    assert list(attn.parameters()) == []
    assert {"left", "right"} <= set(attn.state_dict())
    other = _build("factorized_random", fixed_random=True)
    with torch.no_grad():
        other.left.normal_()
    q, k, v = qkv(1, H, 20)
    assert not torch.allclose(other(q, k, v), attn(q, k, v))
    other.load_state_dict(attn.state_dict())
    assert torch.equal(other(q, k, v), attn(q, k, v))


@pytest.mark.parametrize(("variant", "mix"), [("dense", "dot"), ("random", "none")])
def test_evaluation_is_deterministic_and_a_loaded_state_dict_reproduces_it(variant, mix):
    a, b = _build(variant, mix), _build(variant, mix)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(1.0)
    q, k, v = qkv(2, H, 31)
    torch.manual_seed(1)
    out = a(q, k, v)
    torch.manual_seed(2)
    assert torch.equal(a(q, k, v), out)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(q, k, v), out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_half_precision_is_finite_and_close(variant, dtype):
    attn = _build(variant, "dot").float()
    q, k, v = (x.to(dtype) for x in qkv(2, H, 37, scale=2.0))
    for causal in (False, True):
        out = attn(q, k, v, causal=causal)
        ref = attn(q.float(), k.float(), v.float(), causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert_close(out.float(), ref, dtype)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"variant": "sparse"}, "variant must be one of"),
        ({"mix": "sum"}, "mix must be one of"),
        ({"fixed_random": True}, "fixed_random applies to the random variants"),
        ({"rank": 4}, "rank applies to variant='factorized_random'"),
        ({"factor": 4}, "factor applies to variant='factorized_dense'"),
        ({"variant": "factorized_random", "rank": 0}, "rank must be a positive int, got 0"),
        ({"variant": "factorized_dense", "factor": 0}, "factor must be a positive int, got 0"),
        ({"scale": 0.0}, "scale must be positive or None"),
    ],
)
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build("synthesizer", head_dim=16, num_heads=H, max_len=MAX_LEN, **options)


def test_factor_sets_the_shapes_of_the_factorised_dense_networks():
    attn = kattn.build(
        "synthesizer", head_dim=16, num_heads=H, max_len=50, variant="factorized_dense"
    )
    assert (attn.factor, attn.dense_a[2].shape[-1], attn.dense_b[2].shape[-1]) == (8, 8, 7)
    attn = kattn.build(
        "synthesizer", head_dim=16, num_heads=H, max_len=50, variant="factorized_dense", factor=5
    )
    assert (attn.dense_a[2].shape[-1], attn.dense_b[2].shape[-1]) == (5, 10)
