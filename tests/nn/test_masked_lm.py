"""kattn.nn.MaskedLM: BERT's head tied to the embedding, logits at chosen positions, padding
that changes nothing, bidirectional attention with any mechanism, and an encoder whose weights
load into SequenceClassifier's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kattn.nn import MaskedLM, SequenceClassifier

SHAPE = {"dim": 32, "depth": 2, "num_heads": 4, "ffn_dim": 64, "dropout": 0.0}


def model(mechanism: str = "softmax", **options) -> MaskedLM:
    torch.manual_seed(0)
    return MaskedLM(50, 24, mechanism=mechanism, **SHAPE, **options).double().eval()


def test_the_head_is_berts_and_tied_to_the_embedding():
    net = model()
    tokens = torch.randint(0, 50, (3, 17))
    logits = net(tokens)
    assert logits.shape == (3, 17, 50)
    hidden = net.encoder(tokens)
    head = net.head
    expected = F.layer_norm(F.gelu(head.dense(hidden)), (32,), head.norm.weight, head.norm.bias)
    assert torch.allclose(logits, expected @ net.embedding.weight.T + head.bias)
    assert "head.decoder.weight" not in net.state_dict() and "head.bias" in net.state_dict()
    logits.sum().backward()
    assert net.embedding.weight.grad is not None and net.head.bias.grad is not None


def test_an_untied_head_has_its_own_matrix():
    net = MaskedLM(50, 24, tie_embeddings=False, **SHAPE)
    assert net.head.decoder is not None
    assert net.tie_embeddings is False and MaskedLM(50, 24, **SHAPE).tie_embeddings is True
    assert net.head.decoder.weight.data_ptr() != net.embedding.weight.data_ptr()
    assert net(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)


def test_select_gives_the_logits_of_the_chosen_positions_only():
    net = model()
    tokens = torch.randint(0, 50, (3, 17))
    select = torch.rand(3, 17, generator=torch.Generator().manual_seed(1)) < 0.3
    picked = net(tokens, select=select)
    assert picked.shape == (int(select.sum()), 50)
    assert torch.allclose(picked, net(tokens)[select])
    with pytest.raises(ValueError, match="select must be a bool mask"):
        net(tokens, select=select[:, :5])


@pytest.mark.parametrize("mechanism", ["softmax", "nprf_rpe"])
def test_padding_changes_no_output_and_every_token_sees_both_sides(mechanism):
    net = model(mechanism, **({"num_features": 16} if mechanism != "softmax" else {}))
    tokens = torch.randint(0, 50, (2, 20))
    pad = torch.zeros(2, 20, dtype=torch.bool)
    pad[:, 14:] = True
    other = tokens.clone()
    other[:, 14:] = 7  # other ids in the padding
    a = net(tokens, pad)[:, :14]
    assert torch.allclose(a, net(other, pad)[:, :14], atol=1e-10)
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 50  # a later token changes earlier outputs
    assert not torch.allclose(net(changed, pad)[:, 2], a[:, 2])


def test_the_encoder_loads_into_a_sequence_classifier():
    net = model("nprf_rpe", num_features=16)
    classifier = SequenceClassifier(50, 24, 3, mechanism="nprf_rpe", num_features=16, **SHAPE)
    missing = classifier.encoder.load_state_dict(net.encoder.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys
    classifier.double().eval()
    tokens = torch.randint(0, 50, (2, 10))
    assert torch.equal(classifier.encoder(tokens), net.encoder(tokens))


def test_bad_tokens_are_refused():
    net = model()
    with pytest.raises(ValueError, match=r"tokens must be \(B, L\)"):
        net(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must be in"):
        net(torch.full((1, 3), 50))
