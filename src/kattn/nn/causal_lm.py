"""A decoder-only language model whose attention is any causal kattn mechanism.

A :class:`~kattn.nn.encoder.TransformerEncoder` run causally (token embedding plus learned or
sinusoidal positions, or none when the mechanism's relative positions are enough; ``depth``
blocks; a final LayerNorm in the pre-LN form) and a linear head onto the vocabulary, tied to
the embedding by default.

Decoding keeps one state per layer: the recurrent state of kernelized mechanisms (constant
memory and time per token), the key/value cache of ``softmax``. :meth:`CausalLM.prefill`
reads a prompt in parallel form and returns that state; :meth:`CausalLM.step` adds one token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .encoder import TransformerEncoder
from .generation import generate


@dataclass
class DecodingState:
    """What :meth:`CausalLM.step` continues from.

    Attributes:
        position: tokens read so far (the position of the next token).
        layers: one attention state per layer (see the mechanisms' ``init_state``).
    """

    position: int
    layers: list[Any]

    def clone(self) -> DecodingState:
        """A copy whose tensors are new. Steps without a graph update a state in place (the
        recurrent sums and the key/value cache alike), so branching (beam search, several
        continuations of one prompt) continues from clones."""
        return DecodingState(self.position, [_clone_tensors(x) for x in self.layers])


def _clone_tensors(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple state
        return type(x)(*(_clone_tensors(y) for y in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_clone_tensors(y) for y in x)
    if isinstance(x, dict):
        return {k: _clone_tensors(y) for k, y in x.items()}
    return x


class CausalLM(nn.Module):
    """Token ids ``(B, L)`` to next-token logits ``(B, L, vocab_size)``.

    Args:
        vocab_size: number of token ids.
        max_len: longest sequence the model reads (learned positions and mechanisms whose
            parameters depend on it are sized by it).
        dim, depth, num_heads, ffn_dim: the shape (Luo et al. 2021 §4.2, WikiText-103: 512, 6,
            8, 2048).
        mechanism, **options: the attention of every layer (it needs ``supports_causal``) and
            its options.
        positions: ``"learned"`` (up to ``max_len``), ``"sinusoidal"`` (decoding may go past
            ``max_len``) or ``"none"`` (the mechanism's relative positions only, e.g.
            ``rpe="decay"``).
        dropout, attention_dropout, norm_first, block_skip, out_proj: of the blocks (see
            :class:`~kattn.nn.encoder.EncoderLayer`); dropout also follows the embedding.
        embedding_std: std of the normal init of the token and position embeddings.
        tie_embeddings: the output head reuses the token embedding matrix.
        share_rpe: one relative positional encoding for all layers (when the mechanism has one).
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
        self.vocab_size, self.max_len, self.positions = vocab_size, max_len, positions
        self.mechanism = mechanism
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
        if not all(a.supports_causal for a in self.attentions()):
            raise ValueError(
                f"mechanism {mechanism!r} has no causal form (supports_causal is False): a "
                "language model needs one; see kattn list"
            )
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.encoder.embedding.weight
        else:
            nn.init.normal_(self.head.weight, std=embedding_std)

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding (the output head's weight when tied)."""
        return self.encoder.embedding

    @property
    def tie_embeddings(self) -> bool:
        """The output head's weight is the token embedding matrix."""
        return self.head.weight is self.encoder.embedding.weight

    @property
    def layers(self) -> nn.ModuleList:
        """The :class:`~kattn.nn.encoder.EncoderLayer` blocks."""
        return self.encoder.layers

    def attentions(self) -> list[Any]:
        """The attention mechanism of every layer."""
        return [layer.attn.attention for layer in self.layers]  # type: ignore[union-attr]

    @property
    def supports_recurrent(self) -> bool:
        """Every layer decodes with a state (kernelized recurrence or key/value cache)."""
        return all(a.supports_recurrent for a in self.attentions())

    # ---------------------------------------------------------------------------- forward
    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Embeddings ``(B, L, dim)`` of tokens at positions ``start … start + L − 1``."""
        return self.encoder.embed(checked_tokens(tokens), start)

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens (B, L)`` → logits ``(B, L, vocab_size)``; position i sees tokens ≤ i."""
        return self.head(self.encoder(checked_tokens(tokens), causal=True))

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        return self.encoder.regularization_loss()

    # ---------------------------------------------------------------------------- decoding
    def prefill(
        self, tokens: Tensor, state: DecodingState | None = None
    ) -> tuple[Tensor, DecodingState]:
        """Read ``tokens (B, L)`` after ``state`` (None: from the start) in parallel form.

        Returns the logits ``(B, L, vocab_size)`` (equal to :meth:`forward`'s over the whole
        sequence) and the state after these tokens. Needs :attr:`supports_recurrent`.
        """
        self._require_recurrent()
        start = 0 if state is None else state.position
        layers = [None] * len(self.layers) if state is None else list(state.layers)
        if len(layers) != len(self.layers):
            raise ValueError(f"state has {len(layers)} layers, the model {len(self.layers)}")
        x = self.embed(tokens, start)
        for i, layer in enumerate(self.layers):
            x, layers[i] = layer.decode(x, layers[i])  # type: ignore[operator]
        return self.head(self.encoder.norm(x)), DecodingState(start + tokens.shape[1], layers)

    def step(self, token: Tensor, state: DecodingState) -> tuple[Tensor, DecodingState]:
        """One token per sequence, ``token (B,)``, after ``state``: the logits
        ``(B, vocab_size)`` of the next one and the new state; constant time and memory per
        token for kernelized mechanisms.

        Without a graph (``torch.no_grad``, ``torch.inference_mode``) the step writes into
        ``state``'s tensors, as a key/value cache is written: continue from the returned state
        only, and branch from :meth:`DecodingState.clone`."""
        if token.dim() != 1:
            raise ValueError(f"token must be (B,), got {tuple(token.shape)}")
        logits, state = self.prefill(token[:, None], state)
        return logits[:, 0], state

    def _require_recurrent(self) -> None:
        if not self.supports_recurrent:
            names = {type(a).__name__ for a in self.attentions() if not a.supports_recurrent}
            raise NotImplementedError(
                f"{', '.join(sorted(names))} has no recurrent form (supports_recurrent is False): "
                "decode by re-encoding the sequence (generate(..., strategy='reencode'))"
            )

    def generate(self, prompt: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
        """Continue ``prompt`` ((B, L) or (L,) ids) by ``max_new_tokens`` sampled tokens; see
        :func:`kattn.nn.generation.generate` for the options (temperature, top_k, top_p,
        generator, eos_id, strategy)."""
        return generate(self, prompt, max_new_tokens, **options)


def checked_tokens(tokens: Tensor) -> Tensor:
    """``tokens`` itself once it is a ``(B, L)`` batch of int64/int32 ids (else ValueError):
    the input of the language models."""
    if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"tokens must be (B, L) int64/int32 ids, got {tuple(tokens.shape)} {tokens.dtype}"
        )
    return tokens
