"""A Transformer encoder whose attention is any registered mechanism.

The block of the papers' LRA models: pre-LN (``x + Dropout(MHA(LN(x)))``, then
``x + MLP(LN(x))`` with ``MLP = Linear → GELU → Dropout → Linear``) or post-LN, token
embedding plus learned or sinusoidal positions, a final LayerNorm in the pre-LN form. Options
give the block variants of Yorsh 2022, §4.2: a skip connection over the whole block
(``block_skip``) and no projection after the concatenated heads (``out_proj=False``), and
stochastic depth on the residual branches (``drop_path``, as DeiT: Touvron et al. 2021).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import positional
from ..attention.kernelized import rpe_option_names
from ..checks import boolean
from ..registry import spec
from .multihead import MultiheadAttention

#: ``positions`` options of :class:`TransformerEncoder`.
POSITIONS = ("learned", "sinusoidal", "none")


class DropPath(nn.Module):
    """Stochastic depth per example (Huang et al. 2016; DeiT's ``drop_path``, Touvron et al.
    2021): in training, each example's residual branch ``(B, ...)`` is zeroed with probability
    ``p`` and otherwise scaled by ``1 / (1 − p)``, so its expectation is unchanged; the
    identity in evaluation and for ``p = 0``. ``p = 1`` always drops the branch."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"drop_path must be a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep if keep > 0.0 else x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


class EncoderLayer(nn.Module):
    """One Transformer block: self-attention with ``mechanism`` and a GELU MLP.

    Post-LN (``norm_first=False``) and pre-LN (``norm_first=True``), with Drop the dropout
    followed by :class:`DropPath` (the identity unless ``drop_path > 0``)::

        post-LN:  y = LN1(x + Drop(MHA(x)))       out = LN2(y + Drop(FFN(y)) [+ x])
        pre-LN:   y = x + Drop(MHA(LN1(x)))       out = y + Drop(FFN(LN2(y))) [+ x]

    The bracketed ``+ x`` is ``block_skip``: the extra skip connection over the whole block of
    Yorsh 2022 (§4.2, "-Res" variants), added just before the block's last LayerNorm. The
    thesis's block is post-LN; a pre-LN block has no last LayerNorm of its own, so there the
    skip is added to the block's output (the encoder's final LayerNorm follows the last block).

    Args:
        dim: model width; num_heads: heads (``dim`` must be a multiple); ffn_dim: MLP width.
        mechanism, max_len, **options: the attention (``kattn.available()``) and its options.
        dropout: on the attention output, inside and after the MLP.
        attention_dropout: on the attention weights (mechanisms that have them).
        norm_first: pre-LN (default, as the papers' LRA code) or post-LN.
        block_skip: add the block's input once more before its last LayerNorm (see above).
        out_proj: keep the linear layer after the concatenated heads; ``False`` drops it (the
            thesis's variants not marked "-L"; see :class:`~kattn.nn.multihead.MultiheadAttention`).
        drop_path: probability of dropping each residual branch (attention, MLP) per example
            in training (stochastic depth, :class:`DropPath`); 0 (default) never drops.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        mechanism: str = "softmax",
        max_len: int | None = None,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        block_skip: bool = False,
        out_proj: bool = True,
        drop_path: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        boolean("block_skip", block_skip)
        self.drop_path = DropPath(drop_path)
        self.attn = MultiheadAttention(
            dim,
            num_heads,
            dropout=attention_dropout,
            batch_first=True,
            mechanism=mechanism,
            max_len=max_len,
            out_proj=out_proj,
            **options,
        )
        self.norm_attn, self.norm_ffn = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim)
        )
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first
        self.block_skip = block_skip

    def _attend(self, x: Tensor, key_padding_mask: Tensor | None, causal: bool) -> Tensor:
        out = self.attn(x, x, x, key_padding_mask=key_padding_mask, is_causal=causal)[0]
        return self.drop_path(self.dropout(out))

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.drop_path(self.dropout(self.ffn(x)))

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, *, causal: bool = False
    ) -> Tensor:
        """``x (B, L, dim)``; ``key_padding_mask (B, L)`` bool, True marks padding."""
        if self.norm_first:
            y = x + self._attend(self.norm_attn(x), key_padding_mask, causal)
            out = y + self._feed_forward(self.norm_ffn(y))
            return out + x if self.block_skip else out
        y = self.norm_attn(x + self._attend(x, key_padding_mask, causal))
        out = y + self._feed_forward(y)
        return self.norm_ffn(out + x if self.block_skip else out)

    def decode(self, x: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """The causal block over new tokens ``x (B, L, dim)`` that follow ``state`` (the
        attention's decoding state; None before the first token): equal to
        ``forward(..., causal=True)`` over the whole sequence, for mechanisms with
        ``supports_recurrent``. Returns the output and the new state."""
        if self.norm_first:
            attended, state = self.attn.decode(self.norm_attn(x), state)
            y = x + self.drop_path(self.dropout(attended))
            out = y + self._feed_forward(self.norm_ffn(y))
            return (out + x if self.block_skip else out), state
        attended, state = self.attn.decode(x, state)
        y = self.norm_attn(x + self.drop_path(self.dropout(attended)))
        out = y + self._feed_forward(y)
        return self.norm_ffn(out + x if self.block_skip else out), state


def sinusoidal_positions(length: int, dim: int, start: int = 0) -> Tensor:
    """The fixed positions of Vaswani et al.: ``sin``/``cos`` of ``pos / 10000^(2i/dim)``, for
    the positions ``start … start + length − 1``."""
    pos = torch.arange(start, start + length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class TransformerEncoder(nn.Module):
    """Token ids ``(B, L)`` to features ``(B, L, dim)``: embedding, positions, ``depth``
    :class:`EncoderLayer` blocks, and (pre-LN) a final LayerNorm.

    Args:
        vocab_size: number of token ids; max_len: longest sequence (positions, mechanisms
            that need it).
        dim, depth, num_heads, ffn_dim: the shape (Skyformer's LRA model: 64, 2, 2, 128).
        mechanism, **options: the attention of every layer and its options.
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        dropout, attention_dropout, norm_first: of the blocks (and dropout after embedding).
        block_skip, out_proj: block variants of Yorsh 2022 (see :class:`EncoderLayer`).
        cls_token: prepend a learned [CLS] vector (zeros at init, as the KL-Transformer's code)
            to every sequence; outputs then have L + 1 positions, the first one the CLS.
        share_rpe: when the mechanism has a relative positional encoding (``rpe=``, or a
            preset such as ``nprf_rpe``), build it once and share it across the layers (one
            bias per offset for the whole model) instead of one per layer.
        embedding_std: std of the normal init of the token and learned position embeddings
            (0.02 as the Skyformer/Nyströmformer LRA code; LRA's JAX models use 1.0).
        embed_scale: the token embeddings are multiplied by it before positions are added
            (Vaswani et al. 2017, §3.4, use √dim with embeddings of std 1/√dim, so that
            tokens are not drowned by the unit-amplitude sinusoids).
        embedding_norm: a LayerNorm over token plus position embeddings, before the
            embedding dropout, as BERT (Devlin et al. 2019) and fairseq's RoBERTa-base have in
            front of their post-LN blocks (the submodule ``embedding_norm``; None without).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 2,
        ffn_dim: int = 128,
        mechanism: str = "softmax",
        positions: str = "learned",
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        embedding_std: float = 0.02,
        embed_scale: float = 1.0,
        block_skip: bool = False,
        out_proj: bool = True,
        cls_token: bool = False,
        share_rpe: bool = True,
        embedding_norm: bool = False,
        **options: Any,
    ) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if vocab_size < 1 or max_len < 1 or depth < 1:
            raise ValueError(
                f"vocab_size, max_len and depth must be positive, got {vocab_size}, {max_len}, "
                f"{depth}"
            )
        self.max_len, self.embed_scale = max_len, float(embed_scale)
        self.cls: nn.Parameter | None = nn.Parameter(torch.zeros(dim)) if cls_token else None
        max_len = max_len + int(cls_token)  # positions and mechanisms see the CLS too
        if share_rpe:
            options = shared_rpe_options(mechanism, num_heads, max_len, options)
        self.embedding = nn.Embedding(vocab_size, dim)
        self.position: nn.Embedding | None = None
        self.register_buffer("sinusoid", None, persistent=False)
        if positions == "learned":
            self.position = nn.Embedding(max_len, dim)
        elif positions == "sinusoidal":
            self.sinusoid = sinusoidal_positions(max_len, dim)
        self.embedding_norm = nn.LayerNorm(dim) if embedding_norm else None
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(
                dim,
                num_heads,
                ffn_dim,
                mechanism=mechanism,
                max_len=max_len,
                dropout=dropout,
                attention_dropout=attention_dropout,
                norm_first=norm_first,
                block_skip=block_skip,
                out_proj=out_proj,
                **options,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim) if norm_first else nn.Identity()
        nn.init.normal_(self.embedding.weight, std=embedding_std)
        if self.position is not None:
            nn.init.normal_(self.position.weight, std=embedding_std)

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Token plus position embeddings, ``(B, L, dim)`` (``L + 1`` with the CLS first), of
        tokens at positions ``start …`` (``start > 0``: decoding after earlier tokens)."""
        length = tokens.shape[1]
        if start == 0 and length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
        check_token_ids(tokens, self.embedding.num_embeddings)
        x = self.embedding(tokens)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if self.cls is not None:
            x = torch.cat([self.cls.to(x.dtype).expand(x.shape[0], 1, -1), x], dim=1)
            length += 1
        end = start + length
        if self.position is not None:
            if end > self.position.num_embeddings:
                raise ValueError(
                    f"position {end - 1} is beyond max_len={self.max_len} of the learned "
                    "positions: build the model with a larger max_len, or with "
                    "positions='sinusoidal' or 'none' for unbounded decoding"
                )
            x = x + self.position.weight[start:end]
        elif self.sinusoid is not None:
            table = self.sinusoid[start:end] if end <= self.sinusoid.shape[0] else None
            if table is None:  # beyond the table: the same formula, computed for these rows
                table = sinusoidal_positions(length, x.shape[-1], start).to(x.device)
            x = x + table.to(x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return self.dropout(x)

    def forward(
        self,
        tokens: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        causal: bool = False,
        final_norm: bool = True,
    ) -> Tensor:
        """``tokens (B, L)`` → ``(B, L, dim)`` (``L + 1`` with ``cls_token``, the CLS first);
        ``final_norm=False`` returns the last block's output before the final LayerNorm."""
        x = self.embed(tokens)
        if self.cls is not None and key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (1, 0), value=False)
        for layer in self.layers:
            x = layer(x, key_padding_mask, causal=causal)
        return self.norm(x) if final_norm else x

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        return attention_penalties(self.layers, self.embedding.weight.device)


def attention_penalties(layers: nn.ModuleList, device: torch.device) -> Tensor:
    """Sum of the penalties of the attention mechanisms of ``layers`` (EncoderLayers)."""
    total = torch.zeros((), device=device)
    for layer in layers:
        assert isinstance(layer, EncoderLayer)
        total = total + layer.attn.attention.regularization_loss()
    return total


def shared_rpe_options(
    mechanism: str, num_heads: int, max_len: int, options: dict[str, Any]
) -> dict[str, Any]:
    """``options`` with the mechanism's relative positional encoding built once as a module
    (so every layer given these options shares it); unchanged without a named encoding."""
    merged = {**spec(mechanism).defaults, **options}
    rpe = merged.get("rpe")
    if not isinstance(rpe, str) or rpe not in positional.available():
        return options
    names = rpe_option_names(rpe)
    own = {names[o]: v for o, v in options.items() if o in names}
    module = positional.build(rpe, num_heads=num_heads, max_len=max_len, **own)
    return {**{o: v for o, v in options.items() if o not in names}, "rpe": module}


def check_token_ids(tokens: Tensor, vocab_size: int, *, on_any_device: bool = False) -> None:
    """``ValueError`` naming the vocabulary size if an id of ``tokens`` is outside
    ``[0, vocab_size)`` (the embedding lookup would fail with a bare index error).

    Checked on CPU tensors, and on any device with ``on_any_device`` (a prompt, once per
    generation): on an accelerator the check is a device-to-host synchronisation, which every
    forward and decoding step would pay, and the lookup there stops the program with a
    device-side assert anyway. Skipped while ``torch.compile`` traces (it would break the
    graph)."""
    if tokens.numel() == 0 or torch.compiler.is_compiling():
        return
    if tokens.device.type != "cpu" and not on_any_device:
        return
    low, high = torch.aminmax(tokens)
    if bool((low < 0) | (high >= vocab_size)):  # one device-to-host read
        raise ValueError(
            f"token ids must be in [0, vocab_size) = [0, {vocab_size}), got ids from "
            f"{int(low)} to {int(high)}"
        )
