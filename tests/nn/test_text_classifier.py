"""kattn.nn.TextClassifier: exported beside MaskedLM and documented in the API page, a
pre-trained MaskedLM's encoder under RoBERTa's head, pooling that padding does not change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kattn.nn
from kattn.nn import MaskedLM, TextClassifier, TransformerEncoder

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_text_models_are_exported_and_documented() -> None:
    page = API_PAGE.read_text()
    for name in ("MaskedLM", "TextClassifier"):
        assert name in kattn.nn.__all__ and f"`{name}(" in page, name
    assert kattn.nn.TextClassifier.__module__ == "kattn.nn.text_classifier"


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_pretrained_encoder_classifies_and_padding_changes_nothing(pooling: str) -> None:
    torch.manual_seed(0)
    pretrained = MaskedLM(40, 16, dim=16, depth=1, num_heads=2, ffn_dim=32, dropout=0.0)
    model = TextClassifier(pretrained.encoder, outputs=3, pooling=pooling).double().eval()
    assert model.encoder is pretrained.encoder  # the weights are the pre-trained ones
    tokens = torch.randint(0, 40, (2, 16))
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[1, 10:] = True
    logits = model(tokens, padding)
    assert logits.shape == (2, 3)
    changed = tokens.clone()
    changed[1, 10:] = 7  # other ids in the padded positions
    torch.testing.assert_close(model(changed, padding), logits, rtol=0.0, atol=1e-12)
    torch.testing.assert_close(model(tokens[1:, :10])[0], logits[1], rtol=1e-10, atol=1e-12)


def test_an_encoder_with_its_own_cls_vector_is_refused() -> None:
    encoder = TransformerEncoder(40, 16, dim=16, depth=1, num_heads=2, ffn_dim=32, cls_token=True)
    with pytest.raises(ValueError, match=r"encoder must read the \[CLS\] token"):
        TextClassifier(encoder, outputs=2)
