"""A masked language model (BERT, Devlin et al. 2019) whose attention is any kattn mechanism.

A bidirectional :class:`~kattn.nn.encoder.TransformerEncoder` (token embedding, learned,
sinusoidal or no absolute positions, ``depth`` blocks; any mechanism, any relative positional
encoding) and BERT's prediction head: ``Linear(dim, dim) → GELU → LayerNorm`` then the
output layer onto the vocabulary, whose weight is the token embedding (tied) and which has a
bias of its own.

The encoder is the same module, with the same ``state_dict`` keys, as the encoder of
:class:`~kattn.nn.SequenceClassifier`: ``model.encoder.state_dict()`` loads into
``SequenceClassifier(vocab_size, max_len, n, pooling="mean", ...).encoder`` built with the
same shape and mechanism (fine-tuning a pre-trained model).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .causal_lm import checked_tokens
from .encoder import TransformerEncoder


class MaskedLMHead(nn.Module):
    """BERT's prediction head: ``LayerNorm(GELU(x W₁ + b₁)) Eᵀ + b``, ``E (V, dim)`` the
    output matrix: the token embedding when tied (given at each call), else its own."""

    def __init__(self, dim: int, vocab_size: int, *, tied: bool = True) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.decoder = None if tied else nn.Linear(dim, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: Tensor, embedding: Tensor | None = None) -> Tensor:
        """``x (…, dim)`` → logits ``(…, vocab_size)``; ``embedding (V, dim)`` when tied."""
        h = self.norm(F.gelu(self.dense(x)))
        weight = self.decoder.weight if self.decoder is not None else embedding
        if weight is None:
            raise ValueError("a tied head needs the token embedding: pass embedding=")
        return F.linear(h, weight, self.bias)


class MaskedLM(nn.Module):
    """Token ids ``(B, L)`` to logits over the vocabulary at every (or at chosen) positions.

    Args:
        vocab_size: number of ids, special tokens included (:func:`kattn.data.mlm_vocab`).
        max_len: longest sequence (learned positions, mechanisms that need it).
        dim, depth, num_heads, ffn_dim: the shape (BERT-base: 768, 12, 12, 3072).
        mechanism, **options: the attention of every layer and its options (bidirectional:
            any mechanism; ``rpe=`` gives relative positions).
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        dropout, attention_dropout, norm_first, block_skip, out_proj: of the blocks (see
            :class:`~kattn.nn.encoder.EncoderLayer`); BERT's blocks are post-LN
            (``norm_first=False``).
        embedding_std: std of the normal init of the token and position embeddings (BERT 0.02).
        tie_embeddings: the output layer reuses the token embedding (BERT); False gives it
            its own matrix.
        share_rpe: one relative positional encoding for all layers.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        dim: int = 256,
        depth: int = 4,
        num_heads: int = 4,
        ffn_dim: int = 1024,
        mechanism: str = "softmax",
        positions: str = "learned",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        embedding_std: float = 0.02,
        tie_embeddings: bool = True,
        block_skip: bool = False,
        out_proj: bool = True,
        share_rpe: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        self.vocab_size, self.max_len, self.mechanism = vocab_size, max_len, mechanism
        self.encoder = TransformerEncoder(
            vocab_size,
            max_len,
            dim=dim,
            depth=depth,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            mechanism=mechanism,
            positions=positions,
            dropout=dropout,
            attention_dropout=attention_dropout,
            norm_first=norm_first,
            embedding_std=embedding_std,
            block_skip=block_skip,
            out_proj=out_proj,
            share_rpe=share_rpe,
            **options,
        )
        self.head = MaskedLMHead(dim, vocab_size, tied=tie_embeddings)
        if self.head.decoder is not None:
            nn.init.normal_(self.head.decoder.weight, std=embedding_std)

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding (the output layer's weight when tied)."""
        return self.encoder.embedding

    @property
    def tie_embeddings(self) -> bool:
        """The output layer reuses the token embedding (the head has no matrix of its own)."""
        return self.head.decoder is None

    def forward(
        self,
        tokens: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        select: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, L, vocab_size)`` of ``tokens (B, L)``; with ``select`` (``(B, L)``
        bool, e.g. the masked positions) only those positions', ``(N, vocab_size)`` in
        row-major order (the head's cost is then paid for them alone).

        ``key_padding_mask (B, L)`` bool marks padding (True), which no token attends to.
        """
        x = self.encoder(checked_tokens(tokens), key_padding_mask)
        if select is not None:
            if select.shape != tokens.shape or select.dtype != torch.bool:
                raise ValueError(
                    f"select must be a bool mask shaped like tokens {tuple(tokens.shape)}, got "
                    f"{tuple(select.shape)} {select.dtype}"
                )
            x = x[select]
        return self.head(x, self.encoder.embedding.weight)  # used only by a tied head

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        return self.encoder.regularization_loss()
