"""Causal SimpleTRON: the thesis's unscaled recurrence ``z_i = q_i·S_i``,
``S_i = S_{i−1} + k_i v_iᵀ`` (Yorsh 2022, §4.2) by default, and the ``sqrt_prefix_count``
variant; every path (forward, reference, prefill, steps) agrees under each option."""

import pytest
import torch

import kattn
from kattn.functional.simpletron import (
    CAUSAL_SCALES,
    simpletron_attention,
    simpletron_attention_reference,
    simpletron_prefill,
)

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

B, H, L, D, DV = 2, 3, 29, 16, 8
PADS = (4, 9)


def build(**options):
    return kattn.build("simpletron", head_dim=D, num_heads=H, **options)


def recurrence(q, k, v, mask=None, *, divide_by_count=False):
    """The thesis's recurrent form, one position at a time: ``S_i = S_{i−1} + k_i v_iᵀ``,
    ``z_i = q_i·S_i`` (over √n_i, n_i the non-padded keys so far, if ``divide_by_count``)."""
    keep = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool) if mask is None else ~mask
    s = torch.zeros(*k.shape[:2], k.shape[-1], v.shape[-1], dtype=k.dtype)  # (B, H, D, Dv)
    n = torch.zeros(k.shape[0], dtype=k.dtype)
    out = []
    for i in range(k.shape[2]):
        kept = keep[:, i].to(k.dtype)  # (B,)
        s = s + kept[:, None, None, None] * k[:, :, i, :, None] * v[:, :, i, None, :]
        n = n + kept
        z = torch.einsum("bhd,bhde->bhe", q[:, :, i], s)
        out.append(z / n.clamp_min(1.0).sqrt()[:, None, None] if divide_by_count else z)
    return torch.stack(out, dim=2)


def test_the_default_causal_form_is_the_thesis_recurrence_without_scale():
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    expected = recurrence(q, k, v)
    assert build().causal_scale == "none"
    assert_close(build()(q, k, v, causal=True), expected)
    assert_close(simpletron_attention(q, k, v, causal=True, chunk_size=8), expected)
    assert_close(simpletron_attention_reference(q, k, v, causal=True), expected)
    # not the prefix-count variant: position i differs from it by the factor √i
    scaled = recurrence(q, k, v, divide_by_count=True)
    assert (expected - scaled).norm() / expected.norm() > 0.5


@pytest.mark.parametrize("causal_scale", CAUSAL_SCALES)
@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])
def test_every_causal_path_equals_the_recurrence(causal_scale, padded):
    q, k, v = qkv(B, H, L, d=D, dv=DV, requires_grad=True)
    mask = padding_mask(B, L, PADS) if padded else None
    divide = causal_scale == "sqrt_prefix_count"
    expected = recurrence(q, k, v, mask, divide_by_count=divide)
    fast = simpletron_attention(
        q, k, v, causal=True, key_padding_mask=mask, causal_scale=causal_scale, chunk_size=8
    )
    ref = simpletron_attention_reference(
        q, k, v, causal=True, key_padding_mask=mask, causal_scale=causal_scale
    )
    assert_close(fast, expected)
    assert_close(ref, expected)
    for g_fast, g_ref, g_exp in zip(
        grads(fast, q, k, v), grads(ref, q, k, v), grads(expected, q, k, v), strict=True
    ):
        assert_close(g_fast, g_exp)
        assert_close(g_ref, g_exp)


@pytest.mark.parametrize("causal_scale", CAUSAL_SCALES)
def test_prefill_and_steps_equal_the_causal_forward(causal_scale):
    attn = build(causal_scale=causal_scale, chunk_size=8, block_size=16)
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    prompt = 11
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, :prompt] = padding_mask(B, prompt, (0, 5), left=True)
    full = attn(q, k, v, causal=True, key_padding_mask=mask)
    assert_close(attn.reference(q, k, v, causal=True, key_padding_mask=mask), full)
    head, state = simpletron_prefill(
        *(x[:, :, :prompt] for x in (q, k, v)),
        key_padding_mask=mask[:, :prompt],
        causal_scale=causal_scale,
        chunk_size=8,
    )
    assert_close(decode_after(attn, head, state, q, k, v), full)
    # the module's own prefill, then steps, without padding
    plain = attn(q, k, v, causal=True)
    head, state = attn.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])
    assert_close(decode_after(attn, head, state, q, k, v), plain)


def decode_after(attn, head, state, q, k, v):
    """``head`` (the prompt's outputs), then one step per remaining token from ``state``."""
    tail, _ = step_through(attn.step, q, k, v, state, start=head.shape[2])
    return torch.cat([head, tail], dim=2)


def test_the_noncausal_form_ignores_causal_scale():
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    expected = q @ (k.transpose(-1, -2) @ v) / L**0.5  # the thesis's 1/√L
    for causal_scale in CAUSAL_SCALES:
        assert_close(build(causal_scale=causal_scale)(q, k, v), expected)


def test_an_unknown_causal_scale_is_refused():
    with pytest.raises(ValueError, match="causal_scale"):
        build(causal_scale="sqrt_length")
    q, k, v = qkv(B, H, 5, d=D, dv=DV)
    with pytest.raises(ValueError, match="causal_scale"):
        simpletron_attention(q, k, v, causal=True, causal_scale=None)
    assert "causal_scale='none'" in repr(build())
