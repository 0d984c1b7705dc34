"""A classifier (or regressor) over a BERT-style encoder: what fine-tuning trains.

The input is ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` (:mod:`kattn.data.text_examples`);
the encoder is the :class:`~kattn.nn.encoder.TransformerEncoder` of a
:class:`~kattn.nn.MaskedLM` (same ``state_dict`` keys, so a pre-trained encoder loads into
it). The head is RoBERTa's sentence-classification head (Liu et al. 2019, fairseq's
``RobertaClassificationHead``; Luo et al. 2021 pre-train as RoBERTa does): the [CLS] output (or
the mean over the non-padded positions), dropout, ``Linear(dim, hidden)``, tanh, dropout,
``Linear(hidden, outputs)``. With ``hidden = dim`` it is BERT's pooler (dense + tanh) and
classifier; the KL-Transformer's GLUE head is this with ``hidden = 128``. One output is a
regression (STS-B's similarity score).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .encoder import TransformerEncoder

POOLINGS = ("cls", "mean")


class ClassificationHead(nn.Module):
    """``Linear(tanh(Linear(dropout(x))))`` with dropout before the last layer:
    ``(…, dim)`` → ``(…, outputs)``."""

    def __init__(self, dim: int, hidden: int, outputs: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, outputs)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.tanh(self.dense(self.dropout(x)))
        return self.out(self.dropout(x))


class TextClassifier(nn.Module):
    """An encoder and :class:`ClassificationHead` over its [CLS] (first) output.

    Args:
        encoder: the (pre-trained or fresh) encoder; its inputs start with [CLS].
        outputs: classes, or 1 for regression.
        hidden: the head's width (default: the encoder's).
        dropout: the head's dropout (BERT and RoBERTa: 0.1).
        pooling: ``"cls"`` (the first position's output) or ``"mean"`` (over the
            non-padded positions).
    """

    def __init__(
        self,
        encoder: TransformerEncoder,
        outputs: int,
        *,
        hidden: int | None = None,
        dropout: float = 0.1,
        pooling: str = "cls",
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if outputs < 1:
            raise ValueError(
                f"outputs must be positive (classes, or 1 for regression), got {outputs}"
            )
        if encoder.cls is not None:
            raise ValueError(
                "encoder must read the [CLS] token from its inputs (built with cls_token=False)"
            )
        dim = encoder.embedding.embedding_dim
        self.encoder, self.pooling = encoder, pooling
        self.head = ClassificationHead(dim, hidden or dim, outputs, dropout)

    def forward(self, tokens: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Logits ``(B, outputs)`` of ``tokens (B, L)`` (``key_padding_mask (B, L)``, True
        marks padding)."""
        x = self.encoder(tokens, key_padding_mask)  # (B, L, dim)
        if self.pooling == "cls":
            pooled = x[:, 0]
        elif key_padding_mask is None:
            pooled = x.mean(dim=1)
        else:
            keep = (~key_padding_mask).to(x.dtype)[..., None]
            pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.head(pooled)

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (for the training loss)."""
        return self.encoder.regularization_loss()
