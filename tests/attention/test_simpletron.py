"""SimpleTRON (Yorsh 2022, §4.2): the formula, its fast and recurrent paths, the block variants."""

import pytest
import torch
import torch.nn.functional as F

import kattn
from kattn.functional.simpletron import (
    SimpletronState,
    simpletron_attention,
    simpletron_attention_reference,
    simpletron_prefill,
)
from kattn.nn import EncoderLayer, MultiheadAttention, SequenceClassifier, TransformerEncoder

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

B, H, L, D, DV = 2, 3, 37, 16, 8
PADS = (5, 11)
MASKS = {"no_padding": None, "padding": padding_mask(B, L, PADS)}


def build(**options):
    return kattn.build("simpletron", head_dim=D, num_heads=H, **options)


def explicit(q, k, v, mask, *, causal):
    """``z_i = q_i·Σ_{j visible} k_j v_jᵀ``, over √n (the visible keys) when non-causal, one
    batch element and query at a time."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    keep = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool) if mask is None else ~mask
    for b in range(q.shape[0]):
        for i in range(q.shape[2]):
            seen = keep[b].clone()
            if causal:
                seen[i + 1 :] = False
            s = torch.einsum("hjd,hje->hde", k[b][:, seen], v[b][:, seen])  # (H, D, Dv)
            n = 1 if causal else max(int(seen.sum()), 1)
            out[b, :, i] = torch.einsum("hd,hde->he", q[b, :, i], s) / n**0.5
    return out


# ------------------------------------------------------------------------- the formula
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_equals_the_explicit_formula(mask_name, causal):
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    mask = MASKS[mask_name]
    expected = explicit(q, k, v, mask, causal=causal)
    assert_close(simpletron_attention(q, k, v, causal=causal, key_padding_mask=mask), expected)
    assert_close(build()(q, k, v, causal=causal, key_padding_mask=mask), expected)
    ref = simpletron_attention_reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(ref, expected)


def test_without_padding_the_noncausal_factor_is_the_thesis_one_over_sqrt_l():
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    expected = q @ (k.transpose(-1, -2) @ v) / L**0.5
    assert_close(simpletron_attention(q, k, v), expected)


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_cross_attention_equals_the_formula(mask_name):
    q, k, v = qkv(B, H, 19, L, d=D, dv=DV)
    mask = MASKS[mask_name]
    out = build()(q, k, v, key_padding_mask=mask)
    assert out.shape == (B, H, 19, DV)
    assert_close(out, explicit(q, k, v, mask, causal=False))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize(
    "chunk_size, block_size",
    [(8, 16), (5, 64), (64, 4096)],
    ids=["C8-blk16", "C5-blk64", "default"],
)
def test_fast_paths_equal_reference_forward_and_gradients(
    causal, mask_name, chunk_size, block_size
):
    q, k, v = qkv(B, H, L, d=D, dv=DV, requires_grad=True)
    mask = MASKS[mask_name]
    fast = simpletron_attention(
        q, k, v, causal=causal, key_padding_mask=mask, chunk_size=chunk_size, block_size=block_size
    )
    ref = simpletron_attention_reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(fast, ref)
    for g_fast, g_ref in zip(grads(fast, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(g_fast, g_ref)


# ------------------------------------------------------------------ causal and recurrent
def test_recurrent_steps_equal_the_causal_forward():
    attn = build(chunk_size=8, block_size=16)
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    steps, state = step_through(attn.step, q, k, v, attn.init_state(B, H, dtype=q.dtype))
    assert isinstance(state, SimpletronState) and state.sums.kv.shape == (B, H, D, DV)
    assert state.num_keys.tolist() == [L, L]
    assert_close(steps, attn(q, k, v, causal=True))


@pytest.mark.parametrize("prompt_pads", [(0, 0), (3, 9)], ids=["prompt", "padded_prompt"])
def test_steps_continue_a_prefilled_prompt(prompt_pads):
    attn, prompt = build(), 20
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, :prompt] = padding_mask(B, prompt, prompt_pads)
    full = attn(q, k, v, causal=True, key_padding_mask=mask)
    prefix = (x[:, :, :prompt] for x in (q, k, v))
    head, state = simpletron_prefill(*prefix, key_padding_mask=mask[:, :prompt], chunk_size=8)
    assert state.num_keys.tolist() == [prompt - p for p in prompt_pads]
    tail, _ = step_through(attn.step, q, k, v, state, start=prompt)
    assert_close(torch.cat([head, tail], dim=2), full)


def test_causal_never_sees_the_future_not_even_its_length():
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    t = 17
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    g = torch.Generator().manual_seed(3)
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn(x[:, :, t + 1 :].shape, generator=g, dtype=x.dtype) * 9
    trailing = padding_mask(B, L, (L - t - 1, 4))  # padding after t changes no earlier output
    for mask in (None, trailing):
        out1 = simpletron_attention(q, k, v, causal=True, chunk_size=8)
        out2 = simpletron_attention(q2, k2, v2, causal=True, key_padding_mask=mask, chunk_size=8)
        torch.testing.assert_close(out1[:, :, : t + 1], out2[:, :, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out1[:, :, t + 1 :], out2[:, :, t + 1 :])


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("left", [False, True], ids=["right_pad", "left_pad"])
def test_padded_keys_do_not_matter(causal, left):
    q, k, v = qkv(B, H, L, d=D, dv=DV)
    mask = padding_mask(B, L, PADS, left=left)
    where = mask[:, None, :].expand(B, H, L)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    k2[where], v2[where] = float("nan"), 1e30  # zeroed before any product
    q2[where] = 50.0
    out1 = simpletron_attention(q, k, v, causal=causal, key_padding_mask=mask, chunk_size=8)
    out2 = simpletron_attention(q2, k2, v2, causal=causal, key_padding_mask=mask, chunk_size=8)
    keep = ~mask
    for b in range(B):
        torch.testing.assert_close(out1[b][:, keep[b]], out2[b][:, keep[b]], rtol=0, atol=1e-12)
    # the count excludes the padded keys: same as running on the kept tokens alone
    kept = [x[1][:, keep[1]][None] for x in (q, k, v)]
    alone = simpletron_attention(*kept, causal=causal)
    torch.testing.assert_close(out1[1:, :, keep[1]], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_fully_padded_sequence_gives_finite_zeros(causal):
    q, k, v = qkv(B, H, L, d=D, dv=DV, requires_grad=True)
    mask = padding_mask(B, L, PADS)
    mask[1] = True
    for fn in (simpletron_attention, simpletron_attention_reference):
        out = fn(q, k, v, causal=causal, key_padding_mask=mask)
        assert torch.isfinite(out).all() and torch.count_nonzero(out[1]) == 0
        assert all(torch.isfinite(g).all() for g in grads(out, q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_inputs(dtype, causal):
    q, k, v = (x.to(dtype) for x in qkv(B, H, L, d=D, dv=DV, dtype=torch.float32))
    mask = MASKS["padding"]
    out = build()(q, k, v, causal=causal, key_padding_mask=mask)
    ref = build()(q.float(), k.float(), v.float(), causal=causal, key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    err = (out.float() - ref).norm() / ref.norm()
    assert err < 1e-2, f"{dtype} relative error {err:.3g}"


# ------------------------------------------------------------------- module and contract
def test_spec_options_and_refusals():
    spec = kattn.spec("simpletron")
    assert "Yorsh" in spec.reference and "4.2" in spec.reference
    assert spec.supports_recurrent and spec.supports_cross and spec.is_exact
    attn = build(chunk_size=8, block_size=16)
    assert (attn.chunk_size, attn.block_size) == (8, 16)
    for bad in ({"chunk_size": 0}, {"block_size": True}, {"chunk_size": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build(**bad)
    with pytest.raises(TypeError, match="feature_map"):
        build(feature_map="elu")
    q, k, v = qkv(B, H, 1, d=D, dv=DV)
    with pytest.raises(ValueError, match="state"):
        attn.step(q, k, v, (None, None))


# ------------------------------------------------------------------------ block variants
def test_multihead_without_out_proj_returns_the_concatenated_heads():
    torch.manual_seed(0)
    mha = MultiheadAttention(24, 3, batch_first=True, mechanism="simpletron", out_proj=False)
    mha = mha.double()
    assert isinstance(mha.out_proj, torch.nn.Identity) and "out_proj=False" in repr(mha)
    assert not any("out_proj" in name for name in mha.state_dict())
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    mask = padding_mask(2, 13, (0, 4))
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    heads = [t.view(2, 13, 3, 8).transpose(1, 2) for t in (q, k, v)]
    core = mha.attention(*heads, key_padding_mask=mask)  # (B, H, L, 8)
    expected = core.transpose(1, 2).reshape(2, 13, 24)
    assert_close(mha(x, x, x, key_padding_mask=mask)[0], expected)
    with_proj = MultiheadAttention(24, 3, mechanism="simpletron")
    assert isinstance(with_proj.out_proj, torch.nn.Linear) and "out_proj=False" not in repr(
        with_proj
    )
    with pytest.raises(ValueError, match="out_proj"):
        MultiheadAttention(24, 3, out_proj="no")


def test_from_torch_keeps_the_projection_and_refuses_to_drop_it():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(24, 3, batch_first=True)
    new = MultiheadAttention.from_torch(ref, mechanism="simpletron", out_proj=True)
    assert torch.equal(new.out_proj.weight, ref.out_proj.weight)
    with pytest.raises(ValueError, match="out_proj"):
        MultiheadAttention.from_torch(ref, mechanism="simpletron", out_proj=False)


def _by_hand(layer, x, mask, *, skip):
    """The block computed from its own submodules (eval: dropout is the identity)."""

    def mha(t):
        return layer.attn(t, t, t, key_padding_mask=mask)[0]

    if layer.norm_first:
        y = x + mha(layer.norm_attn(x))
        out = y + layer.ffn(layer.norm_ffn(y))
        return out + x if skip else out
    y = layer.norm_attn(x + mha(x))
    return layer.norm_ffn(y + layer.ffn(y) + x if skip else y + layer.ffn(y))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("block_skip", [False, True], ids=["default", "block_skip"])
def test_block_skip_formula(norm_first, block_skip):
    torch.manual_seed(0)
    layer = (
        EncoderLayer(
            16,
            2,
            32,
            mechanism="simpletron",
            norm_first=norm_first,
            block_skip=block_skip,
            dropout=0.1,
        )
        .double()
        .eval()
    )
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = padding_mask(2, 11, (0, 3))
    out = layer(x, mask)
    expected = _by_hand(layer, x, mask, skip=block_skip)
    if block_skip:
        assert_close(out, expected)
        assert not torch.allclose(out, _by_hand(layer, x, mask, skip=False))
    else:  # the default block is bit-for-bit the formula without the skip
        assert torch.equal(out, expected)


def test_encoder_and_classifier_pass_the_block_options():
    options = {"dim": 16, "num_heads": 2, "ffn_dim": 32, "depth": 2, "mechanism": "simpletron"}
    enc = TransformerEncoder(20, 16, block_skip=True, out_proj=False, **options)
    clf = SequenceClassifier(20, 16, 3, block_skip=True, out_proj=False, **options)
    for model in (enc, clf.encoder):
        for layer in model.layers:
            assert layer.block_skip and isinstance(layer.attn.out_proj, torch.nn.Identity)
    default = TransformerEncoder(20, 16, **options)
    assert all(not layer.block_skip for layer in default.layers)
    assert any("out_proj" in name for name in default.state_dict())


def test_simple_res_classifier_trains():
    torch.manual_seed(0)
    model = SequenceClassifier(
        20,
        24,
        3,
        dim=16,
        num_heads=2,
        ffn_dim=32,
        depth=2,
        mechanism="simpletron",
        block_skip=True,
        out_proj=False,
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens, labels = torch.randint(1, 20, (8, 24)), torch.randint(0, 3, (8,))
    mask = torch.zeros(8, 24, dtype=torch.bool)
    mask[::2, 18:] = True
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(5):
        loss = F.cross_entropy(model(tokens, mask), labels) + model.regularization_loss()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
