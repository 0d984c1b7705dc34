"""Aggregators of kernelized attention: the plain linear one against the functional calls, the
encodings behind the same interface, and capability flags resolved through the aggregator."""

import copy

import pytest
import torch

import kattn
from kattn import functional as lin
from kattn import positional
from kattn.aggregator import Aggregator, LinearAggregator
from kattn.attention.kernelized import KernelizedAttention
from kattn.attention.rpe_options import aggregator_class

from .helpers import padding_mask, qkv

H, D, MAX_LEN = 3, 8, 32


def features(lq=13, lk=None, *, seed=0):
    """Positive query and key features ``(B, H, L, D)``, values and key log-scales."""
    q, k, v = qkv(h=H, lq=lq, lk=lk, d=D, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    log_scale = torch.randn(k.shape[:3], generator=g, dtype=k.dtype) * 3.0
    return q.exp(), k.exp(), v, log_scale


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_aggregator_attend_is_linear_attention(causal):
    fq, fk, v, s = features()
    mask = padding_mask(fq.shape[0], fk.shape[2], (0, 4))
    options = dict(causal=causal, k_log_scale=s, key_padding_mask=mask, chunk_size=4, eps=1e-9)
    out = LinearAggregator(num_heads=H).attend(fq, fk, v, block_size=8, **options)
    assert torch.equal(out, lin.linear_attention(fq, fk, v, block_size=8, **options))


def test_linear_aggregator_cross_attention_is_linear_attention():
    fq, fk, v, s = features(lq=5, lk=11)
    out = LinearAggregator(num_heads=H).attend(fq, fk, v, k_log_scale=s, positive_features=True)
    assert torch.equal(out, lin.linear_attention(fq, fk, v, k_log_scale=s))


def test_linear_aggregator_decoding_is_the_functional_decoding():
    fq, fk, v, s = features()
    agg = LinearAggregator(num_heads=H)
    state = agg.init_state(fq.shape[0], D, device="cpu", dtype=torch.float64)
    expected_state = lin.linear_attention_init_state(fq.shape[0], H, D, 0, dtype=torch.float64)
    for got, want in zip(state, expected_state, strict=True):
        assert torch.equal(got, want)
    prompt = (fq[:, :, :6], fk[:, :, :6], v[:, :, :6])
    options = dict(k_log_scale=s[:, :, :6], chunk_size=4, block_size=8)
    out, state = agg.prefill(*prompt, state, **options)
    want, expected_state = lin.linear_attention_prefill(*prompt, expected_state, **options)
    assert torch.equal(out, want)
    for t in range(6, fq.shape[2]):
        one = (fq[:, :, t : t + 1], fk[:, :, t : t + 1], v[:, :, t : t + 1])
        out, state = agg.step(*one, state, k_log_scale=s[:, :, t : t + 1], eps=1e-9)
        want, expected_state = lin.linear_attention_step(
            *one, expected_state, k_log_scale=s[:, :, t : t + 1], eps=1e-9
        )
        assert torch.equal(out, want)
    for got, want in zip(state, expected_state, strict=True):
        assert torch.equal(got, want)


def test_linear_aggregator_has_no_positional_weights_and_no_parameters():
    agg = LinearAggregator(num_heads=H)
    assert agg.dense_log(7, 9) is None
    agg.check_lengths(10_000, 3)  # no length it does not cover
    assert list(agg.state_dict()) == [] and list(agg.parameters()) == []
    flags = (agg.supports_recurrent, agg.supports_cross, agg.needs_max_len)
    assert flags == (True, True, False)


def test_the_interface_refuses_decoding_it_does_not_have():
    agg = Aggregator()
    with pytest.raises(NotImplementedError, match="Aggregator has no recurrent form"):
        agg.init_state(2, D, device="cpu", dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="Aggregator has no recurrent form"):
        agg.step(*features(lq=1)[:3], None)
    with pytest.raises(NotImplementedError):
        agg.attend(*features()[:3])


@pytest.mark.parametrize("name", positional.available())
def test_every_encoding_is_an_aggregator(name):
    assert issubclass(positional.get(name), Aggregator)
    assert aggregator_class(name) is positional.get(name)


def build(name="kernelized", **options):
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **options)


@pytest.mark.parametrize("name", ["kernelized", "linear", "performer", "rfa"])
def test_without_an_encoding_the_aggregator_is_the_plain_one(name):
    attn = build(name)
    assert attn.rpe is None and type(attn.aggregator) is LinearAggregator
    assert attn.aggregator.num_heads == H
    assert [n for n, _ in attn.named_children()] == ["feature_map"]  # not a submodule


@pytest.mark.parametrize("name", ["nprf_rpe", "prf_rpe"])
def test_with_an_encoding_the_aggregator_is_the_encoding(name):
    attn = build(name)
    assert attn.aggregator is attn.rpe
    assert isinstance(attn.rpe, positional.ToeplitzBias)
    assert [n for n, _ in attn.named_children()] == ["rpe", "feature_map"]


def test_state_dict_keys_are_those_of_the_feature_map_and_the_encoding():
    shared = positional.build("toeplitz", num_heads=H, max_len=MAX_LEN)
    layers = torch.nn.ModuleDict(
        {
            "kernelized": build("kernelized"),
            "performer": build("performer"),
            "nprf": build("nprf_rpe", rpe=shared),
            "prf": build("prf_rpe", rpe=shared),
            "own": build("prf_rpe"),
        }
    )
    random_features = ["feature_map._extra_state", "feature_map.projection"]
    expected = [
        *(
            f"{layer}.{key}"
            for layer in ("performer", "nprf", "prf", "own")
            for key in random_features
        ),
        "nprf.rpe.bias",
        "prf.rpe.bias",
        "own.rpe.bias",
    ]
    assert sorted(layers.state_dict()) == sorted(expected)  # as before aggregators existed
    assert layers["nprf"].aggregator is layers["prf"].aggregator is shared


def test_a_copy_keeps_one_encoding_module():
    attn = build("nprf_rpe").eval()
    twin = copy.deepcopy(attn).double()
    assert twin.aggregator is twin.rpe and twin.rpe is not attn.rpe
    assert twin.rpe.bias.dtype == torch.float64
    q, k, v = qkv(h=H, lq=9, d=D)
    attn.double()
    assert torch.equal(twin(q, k, v), attn(q, k, v))
    with torch.no_grad():
        twin.rpe.bias.normal_()
    assert not torch.equal(twin(q, k, v), attn(q, k, v))  # the copy attends with its own bias


def capability_flags(flags):
    return flags["supports_recurrent"], flags["supports_cross"]


@pytest.mark.parametrize("name", positional.available())
def test_capabilities_of_a_named_encoding_are_its_class_flags(name):
    cls = positional.get(name)
    expected = (cls.supports_recurrent, cls.supports_cross)
    assert capability_flags(KernelizedAttention.capabilities(rpe=name)) == expected


def test_capabilities_without_an_encoding_are_the_plain_aggregator_flags():
    assert aggregator_class(None) is LinearAggregator
    expected = (LinearAggregator.supports_recurrent, LinearAggregator.supports_cross)
    assert capability_flags(KernelizedAttention.capabilities()) == expected
    assert capability_flags(KernelizedAttention.capabilities(rpe=None)) == expected


@pytest.mark.parametrize("name", positional.available())
def test_an_instance_has_the_flags_of_its_aggregator(name):
    options = {"grid": (4, 4)} if name == "toeplitz2d" else {}
    attn = build(rpe=name, **options)
    cls = positional.get(name)
    assert type(attn.aggregator) is cls
    assert (attn.supports_recurrent, attn.supports_cross) == (
        cls.supports_recurrent,
        cls.supports_cross,
    )
    assert attn.limits_length is cls.needs_max_len
    module = positional.build(name, num_heads=H, max_len=MAX_LEN, **options)
    flags = KernelizedAttention.capabilities(rpe=module)
    assert capability_flags(flags) == (cls.supports_recurrent, cls.supports_cross)


def test_spec_flags_come_from_the_registered_encoding():
    for name in ("nprf_rpe", "prf_rpe"):
        spec = kattn.spec(name)
        assert (spec.supports_recurrent, spec.supports_cross) == (
            positional.ToeplitzBias.supports_recurrent,
            positional.ToeplitzBias.supports_cross,
        )
    spec = kattn.spec("kernelized")
    assert (spec.supports_recurrent, spec.supports_cross) == (
        LinearAggregator.supports_recurrent,
        LinearAggregator.supports_cross,
    )


def test_an_unknown_encoding_name_leaves_the_flags_and_is_refused_by_build():
    assert capability_flags(KernelizedAttention.capabilities(rpe="nope")) == (True, True)
    with pytest.raises(ValueError, match="nope"):
        build(rpe="nope")


def test_the_aggregator_follows_a_reassigned_rpe():
    attn = kattn.build("performer", head_dim=D, num_heads=H, num_features=8)
    assert type(attn.aggregator) is LinearAggregator
    attn.rpe = kattn.positional.build("decay", num_heads=H)
    assert attn.aggregator is attn.rpe
    attn.rpe = None
    assert type(attn.aggregator) is LinearAggregator and "aggregator" not in repr(attn)
