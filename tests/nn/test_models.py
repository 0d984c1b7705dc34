"""The LRA models: CLS pooling, the dual encoder of Retrieval, RPE shared across layers, and the
regularisation losses summed over a model."""

import pytest
import torch

from kattn.nn import DualEncoderClassifier, SequenceClassifier, TransformerEncoder

SMALL = {"dim": 16, "num_heads": 2, "ffn_dim": 32, "depth": 2}


def tokens_and_mask(b=3, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 20, (b, length), generator=g)
    mask = torch.zeros(b, length, dtype=torch.bool)
    mask[0, 8:] = True
    tokens[mask] = 0
    return tokens, mask


def test_cls_pooling_reads_a_learned_token_prepended_to_the_sequence():
    torch.manual_seed(0)
    model = SequenceClassifier(20, 12, 3, pooling="cls", **SMALL).eval()
    tokens, mask = tokens_and_mask()
    assert model.encoder.cls is not None and torch.equal(model.encoder.cls, torch.zeros(16))
    out = model.encoder(tokens, mask)
    assert out.shape == (3, 13, 16)
    torch.testing.assert_close(model(tokens, mask), model.head(out[:, 0]))
    changed = tokens.clone()
    changed[mask] = 7  # padded tokens do not matter to the CLS output
    torch.testing.assert_close(model(changed, mask), model(tokens, mask))


def test_dual_encoder_classifies_the_pair_features_with_one_shared_encoder():
    torch.manual_seed(1)
    model = DualEncoderClassifier(20, 12, **SMALL).eval()
    a, mask_a = tokens_and_mask(seed=1)
    b, mask_b = tokens_and_mask(seed=2)
    x1, x2 = model.encode(a, mask_a), model.encode(b, mask_b)
    expected = model.head(torch.cat([x1, x2, x1 * x2, x1 - x2], dim=-1))
    logits = model(a, b, mask_a, mask_b)
    assert logits.shape == (3, 2)
    torch.testing.assert_close(logits, expected)
    assert model.head[0].in_features == 4 * 16
    assert sum(isinstance(m, TransformerEncoder) for m in model.modules()) == 1


@pytest.mark.parametrize(
    "options",
    [
        {"mechanism": "nprf_rpe"},
        {"mechanism": "kernelized", "feature_map": "prf", "rpe": "bucketed", "num_buckets": 8},
    ],
    ids=["preset", "named-with-options"],
)
def test_relative_positions_are_shared_across_layers(options):
    torch.manual_seed(2)
    enc = TransformerEncoder(20, 12, **{**SMALL, "depth": 3}, **options)
    modules = [layer.attn.attention.rpe for layer in enc.layers]
    assert modules[0] is not None and all(m is modules[0] for m in modules)
    if "num_buckets" in options:
        assert modules[0].num_buckets == 8
    own = TransformerEncoder(20, 12, **{**SMALL, "depth": 3}, share_rpe=False, **options)
    assert len({id(layer.attn.attention.rpe) for layer in own.layers}) == 3
    n_shared = sum(p.numel() for p in enc.parameters())
    n_own = sum(p.numel() for p in own.parameters())
    per_layer = sum(p.numel() for p in modules[0].parameters())
    assert per_layer > 0 and n_own - n_shared == 2 * per_layer
    tokens, mask = tokens_and_mask()
    enc(tokens, mask).sum().backward()
    assert all(p.grad is not None for p in modules[0].parameters())


def test_regularization_losses_of_every_layer_are_summed():
    torch.manual_seed(3)
    model = SequenceClassifier(20, 12, 3, mechanism="ffk_linear", **SMALL)
    maps = [layer.attn.attention.feature_map for layer in model.encoder.layers]
    with torch.no_grad():
        for fm in maps:
            for p in fm.parameters():
                p.add_(0.1 * torch.randn_like(p))
    parts = [fm.regularization_loss() for fm in maps]
    assert all(p > 0 for p in parts)
    torch.testing.assert_close(model.regularization_loss(), sum(parts))


def test_embedding_norm_normalises_token_plus_position_embeddings():
    """``embedding_norm=True`` (BERT's and RoBERTa's LayerNorm in front of post-LN blocks):
    each embedded position has mean 0 and variance 1 at initialisation, the submodule is in
    the state_dict only when asked for, and MaskedLM passes the option through."""
    from kattn.nn import MaskedLM
    from kattn.nn.encoder import TransformerEncoder

    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 9))
    plain = TransformerEncoder(50, 16, dim=32, norm_first=False)
    normed = TransformerEncoder(50, 16, dim=32, norm_first=False, embedding_norm=True)
    assert not any(k.startswith("embedding_norm") for k in plain.state_dict())
    assert {"embedding_norm.weight", "embedding_norm.bias"} <= set(normed.state_dict())
    x = normed.eval().embed(tokens)
    assert torch.allclose(x.mean(-1), torch.zeros(2, 9), atol=1e-5)
    # 1 up to LayerNorm's eps (1e-5) against embeddings of variance about 8e-4
    assert torch.allclose(x.var(-1, unbiased=False), torch.ones(2, 9), atol=0.05)
    assert plain.eval().embed(tokens).std() < 0.1  # embeddings of std 0.02, left as they are
    model = MaskedLM(54, 16, dim=32, depth=1, num_heads=2, ffn_dim=64, embedding_norm=True)
    assert model.encoder.embedding_norm is not None
