"""Informer's ProbSparse attention: the sizes and the default factor, the sample (real keys
only, uniform, batch independent), the sparsity measurement against its definition, the
sparse path against the dense reference (forward and gradients), which queries are exact and
what the lazy ones get, padding, the masked functional form, half precision and the option
checks. The seeded-draw contract is tested for every mechanism in ``test_seeded.py``."""

from __future__ import annotations

import math

import pytest
import torch

import kattn
from kattn.functional import (
    informer_attention,
    informer_attention_reference,
    informer_factor,
    informer_sample,
    informer_sizes,
    informer_sparsity,
)

from ..helpers import assert_close, assert_half_mostly_close, grads, padding_mask, qkv

H, D = 2, 16


def _uniforms(lq: int, samples: int, seed: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(lq, samples, generator=g, dtype=torch.float64)


def _build(seed: int = 0, factor: int = 1, **options) -> kattn.Attention:
    attn = kattn.build("informer", head_dim=D, num_heads=H, seed=seed, factor=factor, **options)
    return attn.double().eval()


def test_sizes_and_the_default_factor():
    assert informer_sizes(100, 1000, 5) == (5 * 7, 5 * 5)  # ⌈ln 1000⌉ = 7, ⌈ln 100⌉ = 5
    assert informer_sizes(10, 12, 5) == (12, 10)  # clamped to the lengths
    assert informer_sizes(1, 1, 3) == (1, 1)
    assert informer_factor(4096) == math.ceil(128 / math.log(4096)) == 16
    assert informer_factor(1024) == 19 and informer_factor(None) == 5
    assert kattn.build("informer", head_dim=D, num_heads=H, max_len=2048).factor == 17
    assert kattn.build("informer", head_dim=D, num_heads=H).factor == 5


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sample_reads_only_allowed_keys_and_ignores_the_batch(causal):
    mask = padding_mask(3, 30, (0, 8, 4), left=True)
    mask[2, -3:] = True
    u = _uniforms(30, 9)
    sample = informer_sample(u, batch=3, lk=30, key_padding_mask=mask, causal=causal)
    assert sample.keys.shape == (3, 30, 9) and sample.valid.shape == (3, 30)
    for b in range(3):
        for i in range(30):
            allowed = {j for j in range(30) if not mask[b, j] and (not causal or j <= i)}
            assert bool(sample.valid[b, i]) == bool(allowed)
            if allowed:
                assert set(sample.keys[b, i].tolist()) <= allowed
        alone = informer_sample(u, batch=1, lk=30, key_padding_mask=mask[b : b + 1], causal=causal)
        assert torch.equal(alone.keys[0], sample.keys[b])
    plain = informer_sample(u, batch=1, lk=30, causal=causal)
    assert torch.equal(plain.keys[0], sample.keys[0])  # no padding in row 0: the same keys


def test_sample_is_uniform_over_the_real_keys():
    mask = padding_mask(1, 12, (4,), left=True)
    sample = informer_sample(_uniforms(400, 30), batch=1, lk=12, key_padding_mask=mask)
    counts = torch.bincount(sample.keys.flatten(), minlength=12).double()
    assert counts[:4].sum() == 0
    expected, sd = 12000 / 8, (12000 * (1 / 8) * (7 / 8)) ** 0.5
    assert ((counts[4:] - expected).abs() < 5 * sd).all(), counts


def test_sparsity_is_max_minus_mean_over_the_sample():
    q, k, _ = qkv(2, H, 11, 17)
    mask = padding_mask(2, 17, (0, 6))
    sample = informer_sample(_uniforms(11, 7), batch=2, lk=17, key_padding_mask=mask)
    measure = informer_sparsity(q, k, sample, key_padding_mask=mask)
    for b in range(2):
        for h in range(H):
            for i in range(11):
                s = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D) for j in sample.keys[b, i]]
                assert measure[b, h, i].item() == pytest.approx(max(s) - sum(s) / len(s))


#: (Lq, Lk, factor, padding, causal): self-attention with padding, cross-attention both
#: ways, the masked form with right and left padding, and every query exact.
CASES = {
    "self-pad": (41, 41, 2, (0, 9), False),
    "cross-short-q": (13, 50, 2, (5, 0), False),
    "cross-long-q": (50, 13, 1, (0, 3), False),
    "causal-pad": (40, 40, 2, (0, 7), True),
    "all-exact": (9, 9, 5, (0, 2), False),
}
IDS = list(CASES)


def _case(case: str, dtype: torch.dtype = torch.float64):
    lq, lk, factor, pads, causal = CASES[case]
    q, k, v = qkv(2, H, lq, lk, requires_grad=True, dtype=dtype)
    mask = padding_mask(2, lk, pads, left=case == "cross-short-q")
    samples, top = informer_sizes(lq, lk, factor)
    sample = informer_sample(
        _uniforms(lq, samples), batch=2, lk=lk, key_padding_mask=mask, causal=causal
    )
    options = {"num_top": top, "causal": causal, "key_padding_mask": mask}
    return (q, k, v), sample, options


@pytest.mark.parametrize("case", IDS)
def test_forward_and_gradients_equal_the_reference(case):
    (q, k, v), sample, options = _case(case)
    out = informer_attention(q, k, v, sample, **options)
    ref = informer_attention_reference(q, k, v, sample, **options)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)


@pytest.mark.parametrize("case", ["self-pad", "cross-short-q", "causal-pad"])
def test_top_queries_get_softmax_and_the_others_the_mean_of_v(case):
    (q, k, v), sample, options = _case(case)
    q, k, v = q.detach(), k.detach(), v.detach()
    mask, causal, top = options["key_padding_mask"], options["causal"], options["num_top"]
    out = informer_attention(q, k, v, sample, **options)
    allowed = (~mask)[:, None, None, :].expand(2, 1, q.shape[2], k.shape[2])
    if causal:
        allowed = allowed & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~allowed, -math.inf)
    full = torch.softmax(scores, -1) @ v
    mean = allowed.double() / allowed.sum(-1, keepdim=True) @ v
    measure = informer_sparsity(q, k, sample, key_padding_mask=mask)
    chosen = measure.argsort(-1, descending=True)[..., :top]
    selected = torch.zeros_like(measure, dtype=torch.bool).scatter(-1, chosen, True)
    assert selected.sum(-1).eq(top).all() and (~selected).any()
    assert_close(out[selected], full[selected])
    assert_close(out[~selected], mean[~selected])


def test_peaked_queries_are_the_exact_ones():
    """Queries aligned with one key have a peaked row (large M̄); random ones do not."""
    q, k, _ = qkv(1, H, 60)
    peaked = [3, 17, 42]
    q[:, :, peaked] = 8.0 * k[:, :, [5, 30, 50]]
    attn = _build(factor=1)  # U = ⌈ln 60⌉ = 5 ≥ u = 5 exact queries
    samples, top = attn.sizes(60, 60)
    u = (
        torch.ones(60, samples, dtype=torch.float64)
        * torch.tensor([5.5, 30.5, 50.5, 0.1, 0.9])
        / 60
    )
    sample = informer_sample(u, batch=1, lk=60)
    measure = informer_sparsity(q, k, sample)
    chosen = set(measure.argsort(-1, descending=True)[0, 0, :top].tolist())
    assert set(peaked) <= chosen


def test_every_query_exact_is_softmax():
    q, k, v = qkv(2, H, 9)
    out = _build(factor=5)(q, k, v)
    assert_close(out, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v)


def test_module_equals_its_reference_and_padded_values_count_nowhere():
    attn = _build(factor=2)
    q, k, v = qkv(2, H, 45, requires_grad=True)
    mask = padding_mask(2, 45, (0, 12))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g).all()
        assert_close(g, g_ref)
    q2, k2, v2 = (x.detach().clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[1, :, 33:] = float("nan")
    out2 = attn(q2, k2, v2, key_padding_mask=mask)
    assert torch.isfinite(out2).all()
    assert_close(out2[:, :, :33], out[:, :, :33].detach())


def test_a_fully_padded_sequence_gives_zeros_and_finite_gradients():
    attn = _build(factor=2)
    q, k, v = qkv(2, H, 30, 20, requires_grad=True)
    mask = padding_mask(2, 20, (0, 20))
    out = attn(q, k, v, key_padding_mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    for g in grads(out, q, k, v):
        assert torch.isfinite(g).all()


def test_masked_form_reads_only_earlier_values_but_its_selection_sees_later_queries():
    """The functional masked form: changing later values leaves earlier outputs alone, but
    changing later queries can change which earlier queries are exact, so the module refuses
    causal=True."""
    (q, k, v), sample, options = _case("causal-pad")
    q, k, v = q.detach(), k.detach(), v.detach()
    out = informer_attention(q, k, v, sample, **options)
    v2 = v.clone()
    v2[:, :, 20:] = 1e3 * torch.randn_like(v2[:, :, 20:])
    assert_close(informer_attention(q, k, v2, sample, **options)[:, :, :20], out[:, :, :20])
    q2 = q.clone()
    q2[:, :, 20:] = 0.0  # later queries become flat: earlier ones take their exact slots
    out2 = informer_attention(q2, k, v, sample, **options)
    assert not torch.allclose(out2[:, :, :20], out[:, :, :20])
    with pytest.raises(NotImplementedError, match="later tokens"):
        _build()(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_finite_and_close(dtype):
    # rounding may swap queries of nearly equal M̄ in and out of the top: compare the rest
    assert_half_mostly_close(_build(factor=2).float(), dtype, H)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"factor": 0}, "factor must be a positive int, got 0"),
        ({"scale": 0.0}, "scale must be positive or None, got 0.0"),
    ],
)
def test_options_are_checked(options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build("informer", head_dim=D, num_heads=H, **options)


def test_per_example_sizes_equal_each_example_alone_and_the_reference():
    """``num_samples`` keeps each example's leading sample columns and a ``(B,)`` num_top its
    own exact queries: the same as the example alone with those sizes."""
    q, k, v = qkv(2, H, 40, requires_grad=True)
    mask = padding_mask(2, 40, (0, 25))
    u = _uniforms(40, 12)
    used, tops = torch.tensor([12, 5]), torch.tensor([9, 4])
    sample = informer_sample(u, batch=2, lk=40, key_padding_mask=mask, num_samples=used)
    options = {"num_top": tops, "key_padding_mask": mask}
    out = informer_attention(q, k, v, sample, **options)
    ref = informer_attention_reference(q, k, v, sample, **options)
    assert_close(out, ref)
    for g, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g, g_ref)
    for b in range(2):
        rows = slice(b, b + 1)
        one = informer_sample(u[:, : used[b]], batch=1, lk=40, key_padding_mask=mask[rows])
        alone = informer_attention(
            q[rows], k[rows], v[rows], one, num_top=int(tops[b]), key_padding_mask=mask[rows]
        )
        assert_close(out[rows], alone)
    with pytest.raises(ValueError, match="num_samples must be"):
        informer_sample(u, batch=2, lk=40, num_samples=torch.tensor([13, 5]))


def test_uniforms_do_not_depend_on_the_lengths():
    attn = _build(factor=2)
    samples = attn.sizes(30, 20)[0]
    assert torch.equal(attn.uniforms(30, 20), attn.uniforms(100, 400)[:30, :samples])


#: (real lengths of the examples, Lq of a cross-attention or None, factor): the padded length
#: of the batch would give other U and u than the real lengths.
ALONE = {
    "self-f2": ((20, 60), None, 2),
    "self-f3": ((7, 45), None, 3),
    "self-f1": ((150, 151), None, 1),
    "cross-f2": ((33, 9), 30, 2),
}


@pytest.mark.parametrize("case", list(ALONE))
@pytest.mark.parametrize("training", [False, True])
def test_an_example_alone_equals_it_right_padded_in_a_longer_batch(case, training):
    lengths, lq, factor = ALONE[case]
    padded = _build(seed=3, factor=factor).train(training)
    total = max(lengths) + 110  # ⌈ln total⌉ > ⌈ln n⌉
    q, k, v = qkv(len(lengths), H, lq or total, total)
    mask = padding_mask(len(lengths), total, tuple(total - n for n in lengths))
    out = padded(q, k, v, key_padding_mask=mask)
    for b, n in enumerate(lengths):
        rows = slice(b, b + 1)
        single = _build(seed=3, factor=factor).train(training)  # draw 1 in training, as padded
        alone = single(q[rows, :, : lq or n], k[rows, :, :n], v[rows, :, :n])
        assert_close(out[rows, :, : lq or n], alone)
