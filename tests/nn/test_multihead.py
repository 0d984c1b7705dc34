"""kattn.MultiheadAttention as a drop-in for torch.nn.MultiheadAttention."""

import itertools

import pytest
import torch

import kattn

E, HEADS = 24, 3


def pair(**kwargs):
    """A torch MHA and a kattn MHA (softmax) with the same weights."""
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(E, HEADS, **kwargs).eval()
    ours = kattn.MultiheadAttention.from_torch(reference, mechanism="softmax").eval()
    return reference, ours


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_self_attention_matches_torch(batch_first, bias):
    reference, ours = pair(batch_first=batch_first, bias=bias)
    x = torch.randn(2, 9, E) if batch_first else torch.randn(9, 2, E)
    close(ours(x, x, x)[0], reference(x, x, x, need_weights=False)[0])
    assert ours(x)[1] is None


def test_cross_attention_with_other_key_and_value_dims():
    reference, ours = pair(batch_first=True, kdim=10, vdim=6)
    q, k, v = torch.randn(2, 5, E), torch.randn(2, 12, 10), torch.randn(2, 12, 6)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, -4:] = True
    close(
        ours(q, k, v, key_padding_mask=mask)[0],
        reference(q, k, v, key_padding_mask=mask, need_weights=False)[0],
    )


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_padding_masks_bool_and_float(kind):
    reference, ours = pair(batch_first=True)
    x = torch.randn(2, 9, E)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, -3:] = True
    if kind == "float":
        mask = torch.zeros(2, 9).masked_fill(mask, float("-inf"))
    close(
        ours(x, x, x, key_padding_mask=mask)[0],
        reference(x, x, x, key_padding_mask=mask, need_weights=False)[0],
    )


@pytest.mark.parametrize("kind", ["bool", "float", "is_causal"])
def test_causal_masks(kind):
    reference, ours = pair(batch_first=True)
    x = torch.randn(2, 9, E)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(9)  # float, −inf above
    expected = reference(x, x, x, attn_mask=causal, need_weights=False)[0]
    if kind == "bool":
        got = ours(x, x, x, attn_mask=torch.isneginf(causal))[0]
    elif kind == "float":
        got = ours(x, x, x, attn_mask=causal)[0]
    else:
        got = ours(x, x, x, is_causal=True)[0]
    close(got, expected)


def test_unbatched_input():
    reference, ours = pair()
    x = torch.randn(7, E)
    close(ours(x, x, x)[0], reference(x, x, x, need_weights=False)[0])


def test_refusals_are_clear():
    _, ours = pair(batch_first=True)
    x = torch.randn(2, 5, E)
    with pytest.raises(NotImplementedError, match="need_weights"):
        ours(x, x, x, need_weights=True)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        ours(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.bool).fill_diagonal_(True))
    with pytest.raises(ValueError, match="key_padding_mask"):
        ours(x, x, x, key_padding_mask=torch.full((2, 5), 0.5))
    with pytest.raises(NotImplementedError, match="add_bias_kv"):
        kattn.MultiheadAttention(E, HEADS, add_bias_kv=True)
    with pytest.raises(ValueError, match="multiple"):
        kattn.MultiheadAttention(E, 5)
    with pytest.raises(TypeError, match="num_features"):
        kattn.MultiheadAttention(E, HEADS, mechanism="linear", num_features=3)


def test_dropout_goes_to_softmax_and_warns_elsewhere():
    mha = kattn.MultiheadAttention(E, HEADS, dropout=0.2, mechanism="softmax")
    assert mha.attention.dropout == 0.2
    with pytest.warns(UserWarning, match="dropout"):
        kattn.MultiheadAttention(E, HEADS, dropout=0.2, mechanism="performer")


@pytest.mark.parametrize("name", kattn.available())
def test_every_mechanism_runs_with_padding_and_causal(name):
    torch.manual_seed(0)
    mha = kattn.MultiheadAttention(E, HEADS, mechanism=name, batch_first=True, max_len=32)
    x = torch.randn(2, 11, E, requires_grad=True)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0, -2:] = True
    out, _ = mha(x, key_padding_mask=mask, is_causal=mha.attention.supports_causal)
    out.sum().backward()
    assert out.shape == x.shape and torch.isfinite(x.grad).all()


def test_weights_load_from_a_torch_state_dict():
    reference, _ = pair(batch_first=True)
    ours = kattn.MultiheadAttention(E, HEADS, mechanism="performer", batch_first=True)
    missing = ours.load_state_dict(reference.state_dict(), strict=False)
    assert not missing.unexpected_keys
    assert all(key.startswith("attention.") for key in missing.missing_keys)
    assert torch.equal(ours.in_proj_weight, reference.in_proj_weight)


@pytest.mark.parametrize("batch_first", [False, True])
def test_inputs_of_another_embed_dim_are_refused(batch_first):
    g = torch.Generator().manual_seed(0)
    mha = kattn.MultiheadAttention(E, HEADS, kdim=10, vdim=6, batch_first=batch_first)
    shape = (2, 5) if batch_first else (5, 2)
    q, k, v = (torch.randn(*shape, d, generator=g) for d in (E, 10, 6))
    with pytest.raises(ValueError, match=rf"query.*embed_dim={E}.*got {E + 1}"):
        mha(torch.randn(*shape, E + 1, generator=g), k, v)
    with pytest.raises(ValueError, match=r"key.*kdim=10.*got 9"):
        mha(q, k[..., :9], v)
    with pytest.raises(ValueError, match=r"value.*vdim=6.*got 10"):
        mha(q, k, k)
    with pytest.raises(ValueError, match=r"query.*embed_dim=24.*got 12"):
        mha(*(torch.randn(5, d, generator=g) for d in (12, 10, 6)))  # unbatched
    self_attn = kattn.MultiheadAttention(E, HEADS, mechanism="performer", batch_first=True)
    with pytest.raises(ValueError, match=rf"x.*embed_dim={E}.*got 7"):
        self_attn.decode(torch.randn(2, 1, 7, generator=g))


def test_key_and_value_must_agree_with_the_query_in_batch_and_length():
    g = torch.Generator().manual_seed(0)
    mha = kattn.MultiheadAttention(E, HEADS, batch_first=True)
    q, k = torch.randn(2, 5, E, generator=g), torch.randn(3, 7, E, generator=g)
    with pytest.raises(ValueError, match="batch"):
        mha(q, k, k)
    with pytest.raises(ValueError, match="key and value"):
        mha(q, k[:2], k[:2, :6])


@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_documents_attend_to_themselves_alone(batch_first):
    torch.manual_seed(0)
    mha = kattn.MultiheadAttention(16, 2, mechanism="performer", batch_first=batch_first)
    mha = mha.double().eval()
    x = torch.randn(30, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cu = [0, 10, 25, 30]
    alone = torch.cat([mha(x[a:b], is_causal=True)[0] for a, b in itertools.pairwise(cu)])
    packed, _ = mha(x, cu_seqlens=torch.tensor(cu), is_causal=True)  # unbatched
    torch.testing.assert_close(packed, alone, rtol=1e-9, atol=1e-10)
    batched = x[None] if batch_first else x[:, None]
    out, _ = mha(batched, cu_seqlens=cu, is_causal=True)
    torch.testing.assert_close(out.reshape(30, 16), alone, rtol=1e-9, atol=1e-10)
    memory = torch.randn(12, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cu_k = [0, 5, 6, 12]
    cross, _ = mha(x, memory, memory, cu_seqlens=cu, cu_seqlens_k=cu_k)
    for (a, b), (c, d) in zip(itertools.pairwise(cu), itertools.pairwise(cu_k), strict=True):
        expected = mha(x[a:b], memory[c:d], memory[c:d])[0]
        torch.testing.assert_close(cross[a:b], expected, rtol=1e-9, atol=1e-10)


def test_packed_documents_refuse_what_cannot_go_with_them():
    mha = kattn.MultiheadAttention(16, 2, mechanism="softmax", batch_first=True)
    x = torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match="a batch of 2"):
        mha(x, cu_seqlens=[0, 8])
    with pytest.raises(ValueError, match="key_padding_mask with cu_seqlens"):
        mha(x[:1], cu_seqlens=[0, 8], key_padding_mask=torch.zeros(1, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="cu_seqlens_k needs cu_seqlens"):
        mha(x[:1], cu_seqlens_k=[0, 8])
