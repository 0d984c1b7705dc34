"""``kattn.nn.Seq2Seq``: the teacher-forced forward, incremental decoding equal to it, the
cross-attention cache, padding, batch independence, embeddings and refusals."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.nn.seq2seq import Seq2Seq

SRC_VOCAB, TGT_VOCAB = 23, 19


def _model(decoder: str = "performer", cross: str = "performer", **options) -> Seq2Seq:
    torch.manual_seed(0)
    shape = {"dim": 16, "num_heads": 2, "ffn_dim": 32, "num_encoder_layers": 1}
    kwargs = {**shape, "num_decoder_layers": 2, "max_len": 40, "dropout": 0.0, **options}
    return Seq2Seq(
        SRC_VOCAB, TGT_VOCAB, decoder_attention=decoder, cross_attention=cross, **kwargs
    ).eval()


def _data(b: int = 3, ls: int = 11, lt: int = 9, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, SRC_VOCAB, (b, ls), generator=g)
    tgt = torch.randint(0, TGT_VOCAB, (b, lt), generator=g)
    mask = torch.zeros(b, ls, dtype=torch.bool)
    mask[1, ls - 4 :] = True  # one padded sentence, one full, one with one pad
    mask[-1, ls - 1 :] = True
    return src, tgt, mask


def _stepwise(model: Seq2Seq, src, tgt, mask):
    state = model.init_decoding(model.encode(src, mask), mask)
    rows = []
    for t in range(tgt.shape[1]):
        logits, state = model.decode_step(tgt[:, t], state)
        rows.append(logits)
    return torch.stack(rows, dim=1), state


#: every causal mechanism with a recurrent form, and two that re-read the target prefix
DECODERS = [
    n
    for n in kattn.available()
    if kattn.spec(n).supports_causal and kattn.spec(n).supports_recurrent
] + ["gaussian", "longformer"]
CASES = [(d, "softmax") for d in DECODERS] + [
    (d, c) for d in ("softmax", "performer", "nprf_rpe") for c in ("performer", "rfa", "linear")
]


@pytest.mark.parametrize(("decoder", "cross"), CASES, ids=[f"{d}-x-{c}" for d, c in CASES])
def test_step_by_step_logits_equal_the_forward(decoder, cross):
    model = _model(decoder, cross)
    src, tgt, mask = _data()
    with torch.no_grad():
        expected = model(src, tgt, mask)
        stepped, state = _stepwise(model, src, tgt, mask)
    torch.testing.assert_close(stepped, expected, rtol=1e-4, atol=1e-4)
    assert state.position == tgt.shape[1]
    assert (state.tokens is None) == kattn.spec(decoder).supports_recurrent


def test_kernelized_cross_attention_keeps_feature_sums_and_softmax_keeps_keys():
    src, _, mask = _data()
    with torch.no_grad():
        kernel = _model("performer", "performer")
        cache = kernel.init_decoding(kernel.encode(src, mask), mask).cross[0]
        softmax = _model("performer", "softmax")
        plain = softmax.init_decoding(softmax.encode(src, mask), mask).cross[0]
    m = kernel.decoder_layers()[0].cross_attn.attention.feature_map.num_features
    assert cache.keys is None and cache.kv is not None and cache.k_sum is not None
    assert cache.kv.shape == (3, 2, m, 8) and cache.k_sum.shape == (3, 2, m)
    assert plain.kv is None and plain.keys is not None and plain.keys.shape == (3, 2, 11, 8)


@pytest.mark.parametrize("cross", ["softmax", "performer"])
def test_cross_keys_and_values_are_computed_once_per_source(cross):
    model = _model("performer", cross)
    src, tgt, mask = _data()
    with torch.no_grad():
        expected, _ = _stepwise(model, src, tgt, mask)
        state = model.init_decoding(model.encode(src, mask), mask)
        for layer in model.decoder_layers():  # later projections of the source would differ
            layer.cross_attn.in_proj_weight[16:].mul_(-3.0)
            layer.cross_attn.in_proj_bias[16:].add_(1.0)
        rows = []
        for t in range(tgt.shape[1]):
            logits, state = model.decode_step(tgt[:, t], state)
            rows.append(logits)
        fresh, _ = _stepwise(model, src, tgt, mask)
    torch.testing.assert_close(torch.stack(rows, dim=1), expected, rtol=0, atol=1e-6)
    assert not torch.allclose(fresh, expected, atol=1e-3)


def test_padded_source_tokens_change_nothing():
    model = _model("performer", "performer")
    src, tgt, mask = _data()
    other = torch.where(mask, (src + 5) % SRC_VOCAB, src)
    with torch.no_grad():
        a, b = model(src, tgt, mask), model(other, tgt, mask)
        alone = model(src[1:2, :7], tgt[1:2])  # sentence 1 has 7 real tokens
        stepped, _ = _stepwise(model, other, tgt, mask)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(a[1:2], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stepped, a, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(model(other, tgt), a, atol=1e-3)  # the mask does matter


@pytest.mark.parametrize("decoder", ["softmax", "performer", "gaussian"])
def test_a_sentence_decodes_the_same_alone_and_in_a_batch(decoder):
    model = _model(decoder, "performer")
    src, tgt, mask = _data()
    with torch.no_grad():
        batched, _ = _stepwise(model, src, tgt, mask)
        alone, _ = _stepwise(model, src[1:2, :7], tgt[1:2], None)
    torch.testing.assert_close(batched[1:2], alone, rtol=1e-5, atol=1e-5)


def test_later_target_tokens_do_not_change_earlier_logits():
    model = _model("performer", "performer")
    src, tgt, mask = _data()
    changed = tgt.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % TGT_VOCAB
    with torch.no_grad():
        a, b = model(src, tgt, mask), model(src, changed, mask)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-4)


def test_selecting_rows_of_a_state_continues_those_rows():
    model = _model("softmax", "performer")
    src, tgt, mask = _data()
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        expected, _ = _stepwise(model, src[index], tgt[index], mask[index])
        state = model.init_decoding(model.encode(src, mask), mask)
        rows = []
        for t in range(4):
            logits, state = model.decode_step(tgt[:, t], state)
            rows.append(logits[index])
        state = state.select(index)
        for t in range(4, tgt.shape[1]):
            logits, state = model.decode_step(tgt[index, t], state)
            rows.append(logits)
    torch.testing.assert_close(torch.stack(rows, dim=1), expected, rtol=1e-5, atol=1e-5)


def test_embeddings_are_tied_or_shared_as_asked_and_gradients_flow():
    model = _model("performer", "performer").train()
    assert model.head.weight is model.embedding.weight
    assert model.embedding is not model.encoder.embedding
    untied = _model(tie_output=False)
    assert untied.head.weight is not untied.embedding.weight
    torch.manual_seed(0)
    joint = Seq2Seq(30, 30, dim=16, num_heads=2, ffn_dim=32, num_encoder_layers=1,
                    num_decoder_layers=1, max_len=16, share_embeddings=True)  # fmt: skip
    assert joint.embedding.weight is joint.encoder.embedding.weight is joint.head.weight
    src, tgt, mask = _data()
    logits = model(src, tgt[:, :-1], mask)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("positions", ["learned", "none"])
def test_other_positions_decode_as_the_forward(positions):
    model = _model("performer", "softmax", positions=positions)
    src, tgt, mask = _data()
    with torch.no_grad():
        stepped, _ = _stepwise(model, src, tgt, mask)
        torch.testing.assert_close(stepped, model(src, tgt, mask), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gives_finite_logits(dtype):
    model = _model("performer", "performer").to(dtype)
    src, tgt, mask = _data()
    with torch.no_grad():
        stepped, _ = _stepwise(model, src, tgt, mask)
        logits = model(src, tgt, mask)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    assert torch.isfinite(stepped).all()


def test_unsuitable_mechanisms_are_refused_with_their_name():
    with pytest.raises(ValueError, match="'bigbird' does not support cross-attention"):
        _model("softmax", "bigbird")
    with pytest.raises(ValueError, match="'skyformer' has no causal form"):
        _model("skyformer", "softmax")
    with pytest.raises(ValueError, match=r"'nystromformer' has no causal form.*mixes queries"):
        _model("softmax", "nystromformer")
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary"):
        _model(share_embeddings=True)
    model = _model("performer", "nprf_rpe")
    src, tgt, mask = _data()
    with torch.no_grad():
        assert torch.isfinite(model(src, tgt, mask)).all()  # the forward works
        with pytest.raises(NotImplementedError, match="relative positional encoding"):
            model.init_decoding(model.encode(src, mask), mask)
    plain = _model()
    with torch.no_grad(), pytest.raises(ValueError, match="tokens_t must be"):
        plain.decode_step(tgt, plain.init_decoding(plain.encode(src, mask), mask))
