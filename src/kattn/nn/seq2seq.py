"""An encoder–decoder Transformer (Vaswani et al. 2017, §3.1) whose three attentions are any
kattn mechanisms: encoder self-attention, causal decoder self-attention and cross-attention,
each chosen separately (Luo et al. 2021, §4.3, use kernelized attention in all three for
machine translation).

The encoder is a :class:`~kattn.nn.encoder.TransformerEncoder`; the decoder blocks
(:class:`~kattn.nn.seq2seq_layers.DecoderLayer`) and their cross-attention cache are in
:mod:`kattn.nn.seq2seq_layers` and importable from here as well.

Incremental decoding: :meth:`Seq2Seq.encode` gives the memory, :meth:`Seq2Seq.init_decoding`
projects it once per source into each layer's :class:`CrossCache`, and
:meth:`Seq2Seq.decode_step` reads one target token. The decoder self-attention continues the
mechanism's recurrent state where it has one (an O(M·Dv) state for kernelized mechanisms, a
growing key/value cache for softmax); a causal mechanism without a recurrent form re-reads
the target prefix every step (its cross-attention still uses the cache).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..registry import spec
from .encoder import POSITIONS, TransformerEncoder, check_token_ids, shared_rpe_options
from .encoder import sinusoidal_positions as _sinusoid
from .seq2seq_layers import CrossCache, DecoderLayer, cross_attend, cross_cache

__all__ = ["CrossCache", "DecoderLayer", "Seq2Seq", "Seq2SeqState", "cross_attend", "cross_cache"]


@dataclass
class Seq2SeqState:
    """What :meth:`Seq2Seq.decode_step` continues from.

    Attributes:
        position: target tokens read so far.
        layers: each decoder layer's self-attention state (None before the first token).
        cross: each decoder layer's :class:`CrossCache`.
        tokens: the target tokens so far ``(B, position)``, kept only for mechanisms without
            a recurrent form (which re-read them); None otherwise.
    """

    position: int
    layers: list[Any]
    cross: list[CrossCache]
    tokens: Tensor | None = None

    def select(self, index: Tensor, *, same_source: bool = False) -> Seq2SeqState:
        """The state of batch rows ``index (N,)`` (reordering, repeating or dropping rows, as
        beam search does); the new state's tensors are copies, so states may branch.
        ``same_source=True`` promises that each new row has the source of the row it replaces
        (beams of one sentence), so the cross caches are kept without copying."""
        cross = self.cross if same_source else [c.select(index) for c in self.cross]
        tokens = None if self.tokens is None else self.tokens[index]
        layers = [_select_rows(x, index) for x in self.layers]
        return Seq2SeqState(self.position, layers, cross, tokens)


def _select_rows(x: Any, index: Tensor) -> Any:
    """Rows ``index`` of every tensor in a (nested) decoding state; every mechanism's state
    keeps the batch first."""
    if isinstance(x, Tensor):
        return x[index]
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple state
        return type(x)(*(_select_rows(y, index) for y in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_select_rows(y, index) for y in x)
    return x


def _check_mechanisms(decoder_attention: str, cross_attention: str) -> None:
    if not spec(decoder_attention).supports_causal:
        raise ValueError(
            f"decoder_attention {decoder_attention!r} has no causal form (supports_causal is "
            "False): the decoder's self-attention must not see later target tokens"
        )
    if not spec(cross_attention).supports_cross:
        raise ValueError(
            f"cross_attention {cross_attention!r} does not support cross-attention "
            "(supports_cross is False): it needs as many queries as keys; choose one that "
            "supports_cross (see kattn list)"
        )
    if not spec(cross_attention).supports_causal:
        raise ValueError(
            f"cross_attention {cross_attention!r} has no causal form: it mixes queries (through "
            "landmarks, clusters or query sampling), so in a decoder target position i would "
            "see later target tokens through their queries; choose a mechanism that "
            "supports_causal and supports_cross"
        )


class Seq2Seq(nn.Module):
    """Source ids ``(B, Ls)`` and target inputs ``(B, Lt)`` to next-token logits
    ``(B, Lt, tgt_vocab)``.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes; dim, num_heads, ffn_dim: the shape;
        num_encoder_layers, num_decoder_layers: the depths (Vaswani et al.'s base model:
            512, 8, 2048, 6, 6).
        encoder_attention, decoder_attention, cross_attention: the mechanisms of the encoder's
            self-attention, the decoder's causal self-attention (needs ``supports_causal``)
            and the cross-attention (needs ``supports_cross`` and ``supports_causal``; see
            :func:`_check_mechanisms` for why); ``*_options``: their options.
        max_len: longest source or target (learned positions, mechanisms that need it).
        positions: ``"sinusoidal"`` (default; decoding may go past ``max_len``),
            ``"learned"`` or ``"none"`` (relative positions of the mechanisms only), for both
            the encoder and the decoder.
        dropout, attention_dropout, norm_first: as :class:`~kattn.nn.encoder.EncoderLayer`.
        share_embeddings: one embedding for source and target (a joint vocabulary; needs
            ``src_vocab == tgt_vocab``); tie_output: the output projection is the target
            embedding matrix; embedding_std: std of the normal init of the embeddings.
        scale_embeddings: multiply the token embeddings by √dim (Vaswani et al. 2017, §3.4;
            fairseq's Transformer), with ``embedding_std = dim^-½`` the usual pairing.
        share_rpe: one relative encoding per attention kind across layers (see
            :class:`~kattn.nn.encoder.TransformerEncoder`).
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        *,
        dim: int = 512,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        encoder_attention: str = "softmax",
        decoder_attention: str = "softmax",
        cross_attention: str = "softmax",
        encoder_options: dict[str, Any] | None = None,
        decoder_options: dict[str, Any] | None = None,
        cross_options: dict[str, Any] | None = None,
        max_len: int = 1024,
        positions: str = "sinusoidal",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        share_embeddings: bool = False,
        tie_output: bool = True,
        embedding_std: float = 0.02,
        scale_embeddings: bool = False,
        share_rpe: bool = True,
    ) -> None:
        super().__init__()
        _check_mechanisms(decoder_attention, cross_attention)
        self.embed_scale = self_scale = dim**0.5 if scale_embeddings else 1.0
        if share_embeddings and src_vocab != tgt_vocab:
            raise ValueError(
                f"share_embeddings needs one vocabulary, got src_vocab={src_vocab} and "
                f"tgt_vocab={tgt_vocab}"
            )
        if num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers must be positive, got {num_decoder_layers}")
        self.encoder = TransformerEncoder(
            src_vocab, max_len, dim=dim, depth=num_encoder_layers, num_heads=num_heads,
            ffn_dim=ffn_dim, mechanism=encoder_attention, positions=positions, dropout=dropout,
            attention_dropout=attention_dropout, norm_first=norm_first,
            embedding_std=embedding_std, embed_scale=self_scale, share_rpe=share_rpe,
            **(encoder_options or {}),
        )  # fmt: skip
        self_options, cross = dict(decoder_options or {}), dict(cross_options or {})
        if share_rpe:
            self_options = shared_rpe_options(decoder_attention, num_heads, max_len, self_options)
            cross = shared_rpe_options(cross_attention, num_heads, max_len, cross)
        block: dict[str, Any] = dict(
            self_attention=decoder_attention, cross_attention=cross_attention, max_len=max_len,
            self_options=self_options, cross_options=cross, dropout=dropout,
            attention_dropout=attention_dropout, norm_first=norm_first,
        )  # fmt: skip
        layers = (DecoderLayer(dim, num_heads, ffn_dim, **block) for _ in range(num_decoder_layers))
        self.layers = nn.ModuleList(layers)
        self.max_len, self.positions, self.dim = max_len, positions, dim
        self.embedding = (
            self.encoder.embedding if share_embeddings else nn.Embedding(tgt_vocab, dim)
        )
        self.position = nn.Embedding(max_len, dim) if positions == "learned" else None
        for table in (self.embedding, self.position):
            if table is not None and table is not self.encoder.embedding:
                nn.init.normal_(table.weight, std=embedding_std)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim) if norm_first else nn.Identity()
        self.head = nn.Linear(dim, tgt_vocab, bias=False)
        if tie_output:
            self.head.weight = self.embedding.weight
        else:
            nn.init.normal_(self.head.weight, std=embedding_std)
        assert positions in POSITIONS  # checked by the encoder

    def decoder_layers(self) -> list[DecoderLayer]:
        """The :class:`DecoderLayer` blocks."""
        return [layer for layer in self.layers if isinstance(layer, DecoderLayer)]

    @property
    def max_target_tokens(self) -> int | None:
        """The most target tokens a decoding may emit before its eos when the decoder reads
        positions only up to ``max_len`` (learned positions, or a self-attention whose
        relative encoding has ``max_len`` offsets): ``max_len − 1``; None when unbounded."""
        bounded = self.position is not None or any(
            layer.self_attn.attention.limits_length for layer in self.decoder_layers()
        )
        return self.max_len - 1 if bounded else None

    @property
    def supports_recurrent(self) -> bool:
        """Whether the decoder's self-attention decodes with a state (else it re-reads)."""
        return all(layer.self_attn.attention.supports_recurrent for layer in self.decoder_layers())

    def embed_target(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Token plus position embeddings ``(B, L, dim)`` of target tokens at positions
        ``start … start + L − 1``."""
        check_token_ids(tokens, self.embedding.num_embeddings)
        x = self.embedding(tokens)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        end = start + tokens.shape[1]
        if self.position is not None:
            if end > self.max_len:
                raise ValueError(
                    f"target position {end - 1} is beyond max_len={self.max_len} of the learned "
                    "positions: build the model with a larger max_len or positions='sinusoidal'"
                )
            x = x + self.position.weight[start:end]
        elif self.positions == "sinusoidal":
            x = x + _sinusoid(end - start, self.dim, start).to(x)
        return self.dropout(x)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """``src (B, Ls)`` → the memory ``(B, Ls, dim)``."""
        return self.encoder(_ids(src, "src"), src_padding_mask)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, Lt, tgt_vocab)``; target position i sees target tokens ≤ i and the
        whole (non-padded) source. Masks are ``(B, L)`` bool, True marks padding."""
        memory = self.encode(src, src_padding_mask)
        x = self.embed_target(_ids(tgt_in, "tgt_in"))
        for layer in self.decoder_layers():
            x = layer(x, memory, tgt_padding_mask, src_padding_mask)
        return self.head(self.norm(x))

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        total = self.encoder.regularization_loss()
        for layer in self.decoder_layers():
            for mha in (layer.self_attn, layer.cross_attn):
                total = total + mha.attention.regularization_loss()
        return total

    # ---------------------------------------------------------------------------- decoding
    def init_decoding(self, memory: Tensor, src_padding_mask: Tensor | None = None) -> Seq2SeqState:
        """The state before the first target token: each layer's cross keys and values (or
        kernelized sums) of ``memory (B, Ls, dim)``, computed here once."""
        for layer in self.decoder_layers():
            rpe = getattr(layer.cross_attn.attention, "rpe", None)
            if rpe is not None:
                raise NotImplementedError(
                    f"cross-attention with a relative positional encoding "
                    f"({type(rpe).__name__}) weights keys by the target position, which a "
                    "decoding step does not pass to the mechanism: decode with the full "
                    "forward, or use a cross mechanism without rpe"
                )
        cross = [
            cross_cache(layer.cross_attn, memory, src_padding_mask)
            for layer in self.decoder_layers()
        ]
        tokens = None
        if not self.supports_recurrent:
            tokens = torch.zeros(memory.shape[0], 0, dtype=torch.int64, device=memory.device)
        return Seq2SeqState(0, [None] * len(self.layers), cross, tokens)

    def decode_step(self, tokens_t: Tensor, state: Seq2SeqState) -> tuple[Tensor, Seq2SeqState]:
        """Read one target token per row, ``tokens_t (B,)``: the logits ``(B, tgt_vocab)`` of
        the next one and the new state. Without a graph, recurrent states are updated in
        place: continue from the returned state, branch with :meth:`Seq2SeqState.select`."""
        if tokens_t.dim() != 1:
            raise ValueError(f"tokens_t must be (B,), got {tuple(tokens_t.shape)}")
        if state.tokens is not None:  # no recurrent form: re-read the prefix
            prefix = torch.cat([state.tokens, tokens_t[:, None]], dim=1)
            x = self.embed_target(prefix)
            for layer, cache in zip(self.decoder_layers(), state.cross, strict=True):
                x = layer.reread(x, cache)
            logits = self.head(self.norm(x[:, -1]))
            return logits, replace(state, position=state.position + 1, tokens=prefix)
        x = self.embed_target(tokens_t[:, None], state.position)
        layers = list(state.layers)
        for i, layer in enumerate(self.decoder_layers()):
            x, layers[i] = layer.decode(x, layers[i], state.cross[i])
        logits = self.head(self.norm(x[:, 0]))
        return logits, Seq2SeqState(state.position + 1, layers, state.cross)


def _ids(tokens: Tensor, name: str) -> Tensor:
    if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name} must be (B, L) int64/int32 ids, got {tuple(tokens.shape)} {tokens.dtype}"
        )
    return tokens
