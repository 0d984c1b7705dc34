"""A ``torch.jit.trace`` of SimpleTRON follows the sequence length: its scale 1/√n is computed
from tensors, not baked into the trace as the traced length."""

import warnings

import pytest
import torch

import kattn
from kattn.functional.simpletron import simpletron_attention, simpletron_attention_reference

from ..helpers import assert_close, padding_mask, qkv

B, H, D, DV = 2, 3, 16, 8
TRACED, OTHERS = 23, (9, 37, 64)


def traced(fn, example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated; the trace still runs
        return torch.jit.trace(fn, example)


@pytest.mark.parametrize(
    "fn", [simpletron_attention, simpletron_attention_reference], ids=["fast", "reference"]
)
def test_noncausal_trace_holds_at_other_lengths(fn):
    def run(q, k, v):
        return fn(q, k, v)

    graph = traced(run, qkv(B, H, TRACED, d=D, dv=DV))
    for length in OTHERS:
        q, k, v = qkv(B, H, length, d=D, dv=DV, seed=length)
        expected = q @ (k.transpose(-1, -2) @ v) / length**0.5  # the thesis's 1/√L
        assert_close(graph(q, k, v), expected)


@pytest.mark.parametrize(
    "fn", [simpletron_attention, simpletron_attention_reference], ids=["fast", "reference"]
)
def test_noncausal_trace_with_padding_holds_at_other_lengths(fn):
    def run(q, k, v, mask):
        return fn(q, k, v, key_padding_mask=mask)

    graph = traced(run, (*qkv(B, H, TRACED, d=D, dv=DV), padding_mask(B, TRACED, (0, 4))))
    for length in OTHERS:
        q, k, v = qkv(B, H, length, d=D, dv=DV, seed=length)
        mask = padding_mask(B, length, (0, 4))
        assert_close(graph(q, k, v, mask), run(q, k, v, mask))


@pytest.mark.parametrize("causal_scale", ["none", "sqrt_prefix_count"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_module_trace_holds_at_other_lengths(causal, causal_scale):
    attn = kattn.build("simpletron", head_dim=D, num_heads=H, causal_scale=causal_scale)

    def run(q, k, v):
        return attn(q, k, v, causal=causal)

    graph = traced(run, qkv(B, H, TRACED, d=D, dv=DV))
    for length in OTHERS:
        q, k, v = qkv(B, H, length, d=D, dv=DV, seed=length)
        assert_close(graph(q, k, v), run(q, k, v))


def test_cross_attention_trace_holds_at_other_key_lengths():
    def run(q, k, v):
        return simpletron_attention(q, k, v)

    graph = traced(run, qkv(B, H, 5, TRACED, d=D, dv=DV))
    for length in OTHERS:
        q, k, v = qkv(B, H, 5, length, d=D, dv=DV, seed=length)
        expected = q @ (k.transpose(-1, -2) @ v) / length**0.5
        assert_close(graph(q, k, v), expected)
