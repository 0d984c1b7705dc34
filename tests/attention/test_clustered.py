"""The ``clustered`` and ``improved_clustered`` modules: forward against their dense
reference (forward and gradients), the exact limits, padding (padded queries move no
centroid), cross-attention, the causal refusal, half precision and the option checks. The
seeded-draw contract (batch independence included) is tested for every mechanism in
``test_seeded.py``."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.functional import softmax_attention_reference

from ..helpers import assert_close, grads, padding_mask, qkv

H = 2
NAMES = ["clustered", "improved_clustered"]
#: few clusters and keys, so that the approximation is far from exact softmax.
SMALL = {"num_clusters": 4, "bits": 24}


def _build(name: str, seed: int = 0, **options) -> kattn.Attention:
    if name == "improved_clustered":
        options = {"topk": 5} | options
    attn = kattn.build(name, head_dim=16, num_heads=H, seed=seed, **(SMALL | options))
    return attn.double().eval()


@pytest.mark.parametrize("lk", [37, 52], ids=["self", "cross"])
@pytest.mark.parametrize("name", NAMES)
def test_forward_and_gradients_equal_the_reference(name, lk):
    attn = _build(name)
    q, k, v = qkv(2, H, 37, lk, requires_grad=True)
    mask = padding_mask(2, lk, (0, 9))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)
    assert not torch.allclose(out, softmax_attention_reference(q, k, v, key_padding_mask=mask))


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_padded_keys_and_values_reaches_nothing(name):
    attn = _build(name)
    q, k, v = qkv(2, H, 29, requires_grad=True)
    mask = padding_mask(2, 29, (5, 12))
    pad = mask[:, None, :, None]
    out = attn(
        q, k.masked_fill(pad, torch.nan), v.masked_fill(pad, torch.inf), key_padding_mask=mask
    )
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert_close(out, ref)
    g_q, g_k, g_v = grads(out, q, k, v)
    assert torch.isfinite(g_q).all() and (g_k.masked_select(pad) == 0).all()
    assert (g_v.masked_select(pad) == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_padded_queries_move_no_centroid(name):
    """Changing padded queries (self-attention) changes neither the clusters nor the
    outputs of the unpadded queries."""
    attn = _build(name)
    q, k, v = qkv(2, H, 31)
    mask = padding_mask(2, 31, (0, 8))
    q2 = q.clone()
    q2[1, :, 23:] = 20 * torch.randn(H, 8, 16, generator=torch.Generator().manual_seed(3))
    out, out2 = attn(q, k, v, key_padding_mask=mask), attn(q2, k, v, key_padding_mask=mask)
    assert torch.equal(out[0], out2[0])
    assert_close(out2[1, :, :23], out[1, :, :23])
    groups, groups2 = attn.clusters(q, mask), attn.clusters(q2, mask)
    assert torch.equal(groups[1, :, :23], groups2[1, :, :23])


def test_exact_limits():
    """One query per cluster (clustered) and top-k over every key (improved) are exact
    softmax; fewer clusters are not."""
    q, k, v = qkv(2, H, 23, 40)
    exact = softmax_attention_reference(q, k, v)
    assert_close(_build("clustered", num_clusters=23, bits=63)(q, k, v), exact)
    assert_close(_build("improved_clustered", topk=40)(q, k, v), exact)
    assert_close(_build("improved_clustered", topk=100)(q, k, v), exact)
    assert not torch.allclose(_build("clustered")(q, k, v), exact, atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_improved_is_closer_to_softmax(name):
    """More clusters or more top keys bring the output closer to exact softmax (fixed seeds,
    averaged over queries)."""
    q, k, v = qkv(2, H, 64, scale=1.5)
    exact = softmax_attention_reference(q, k, v)

    def error(**options):
        return (_build(name, **options)(q, k, v) - exact).norm() / exact.norm()

    assert error(num_clusters=32) < error(num_clusters=8) < error(num_clusters=2)
    if name == "improved_clustered":
        assert error(topk=24) < error(topk=8) < error(topk=1)
        assert error(topk=8) < (_build("clustered")(q, k, v) - exact).norm() / exact.norm()


@pytest.mark.parametrize("name", NAMES)
def test_causal_is_refused_with_a_reason(name):
    attn = _build(name)
    assert not attn.supports_causal and attn.supports_cross and not attn.is_exact
    assert kattn.spec(name).approximates == "softmax"
    with pytest.raises(NotImplementedError, match="later tokens"):
        attn(*qkv(1, H, 10), causal=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_is_finite_and_close(name, dtype):
    attn = _build(name).float()
    q, k, v = (x.to(dtype) for x in qkv(2, H, 45, scale=3.0))
    mask = padding_mask(2, 45, (0, 7))
    out = attn(q, k, v, key_padding_mask=mask)
    ref = attn(q.float(), k.float(), v.float(), key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert_close(out.float(), ref, dtype)


def test_defaults_are_the_papers():
    attn = kattn.build("improved_clustered", head_dim=64, num_heads=8)
    assert (attn.num_clusters, attn.iterations, attn.bits, attn.topk) == (100, 10, 63, 32)
    assert attn.hash_bias and attn.scale is None
    plain = kattn.build("clustered", head_dim=64, num_heads=8)
    assert not hasattr(plain, "topk") and plain.num_clusters == 100


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("clustered", {"num_clusters": 0}, "num_clusters must be a positive int, got 0"),
        ("clustered", {"iterations": 0}, "iterations must be a positive int, got 0"),
        ("clustered", {"bits": -3}, "bits must be a positive int, got -3"),
        ("clustered", {"scale": 0.0}, "scale must be positive or None, got 0.0"),
        ("improved_clustered", {"topk": 0}, "topk must be a positive int, got 0"),
    ],
)
def test_options_are_checked(name, options, match):
    with pytest.raises(ValueError, match=match):
        kattn.build(name, head_dim=16, num_heads=H, **options)


def test_option_types_are_checked():
    with pytest.raises(TypeError, match="hash_bias"):
        kattn.build("clustered", head_dim=16, num_heads=H, hash_bias=1)
    with pytest.raises(TypeError, match="topk"):
        kattn.build("clustered", head_dim=16, num_heads=H, topk=4)
