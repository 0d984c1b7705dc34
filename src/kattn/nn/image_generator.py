"""A pixel-level autoregressive image model: the ImageNet32 generation experiment of Luo et
al. 2021 (Appendix A.5, Table 6), on any causal kattn mechanism.

An image ``(C, H, W)`` of 8-bit values is read in sub-pixel raster order (row, column,
channel) as ``L = H·W·C`` tokens of 256 values, the setting of Parmar et al. 2018 (Image
Transformer) and Child et al. 2019 (Sparse Transformer) that Luo et al. follow (L = 3,072 for
32×32 RGB). Token t predicts sub-pixel t from the sub-pixels before it: the input at t is a
start token (t = 0) or sub-pixel t − 1 (a vocabulary of 256 + 1), plus a learned embedding of
the channel being predicted (``t mod C``, so the model knows whether it draws R, G or B),
plus optional learned absolute positions. The score is the mean negative log-likelihood per
sub-pixel in bits, bits/dim (Luo et al. Table 6; 8 for a uniform model).

With the 2-D relative positions of the mechanisms (``rpe="toeplitz2d"``) the grid is
``(H, W·C)``: a sub-pixel's row and its column among the row's ``W·C`` sub-pixels, whose
row-major order is the raster order, so the causal masks agree. :meth:`ImageGenerator.sample`
draws images token by token with the mechanism's decoding state (a recurrent state, the
growing cache of ``toeplitz2d``, softmax's key/value cache).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import positive_int
from .causal_lm import CausalLM, checked_tokens
from .generation import check_sampling, sample_next
from .image_grid import IMAGE_POSITIONS, with_grid
from .image_grid import image_size as parse_image_size
from .image_tools import LEVELS  # values of one sub-pixel; the start token is the id after them

#: Model settings by name, for :meth:`ImageGenerator.from_preset`.
#:
#: ``luo-imagenet32``: Luo et al. 2021, Appendix A.5: a 6-layer NPRF-Transformer with RPE,
#: hidden size 512, 8 heads, feature map dimension 32, dropout 0.1, on ImageNet32 (Chrabaszcz
#: et al. 2017) at sequence length 3,072 (their training: batch 64, Adam (0.9, 0.98) with
#: eps 1e-6, weight decay 0.01, peak learning rate 5e-4). The paper does not give the
#: feed-forward width (2048, 4× as in its language model, §4.2, is ours), the kind of relative
#: positions (the 2-D encoding of its image classifier, §4.4, on the sub-pixel grid, is ours),
#: whether absolute positions are added (none here), the pixel order or the channel input (the
#: raster order of Parmar et al. 2018 / Child et al. 2019 here).
#:
#: ``small``: a model that trains for minutes on a CPU (16 random features).
GENERATOR_PRESETS: dict[str, dict[str, Any]] = {
    "luo-imagenet32": {
        "image_size": 32, "channels": 3, "dim": 512, "depth": 6, "num_heads": 8,
        "ffn_dim": 2048, "mechanism": "nprf_rpe", "rpe": "toeplitz2d", "num_features": 32,
        "positions": "none", "dropout": 0.1, "attention_dropout": 0.0,
    },
    "small": {
        "image_size": 32, "channels": 3, "dim": 64, "depth": 2, "num_heads": 4,
        "ffn_dim": 128, "mechanism": "nprf_rpe", "rpe": "toeplitz2d", "num_features": 16,
        "positions": "none", "dropout": 0.0, "attention_dropout": 0.0,
    },
}  # fmt: skip


class SubPixelLM(CausalLM):
    """:class:`~kattn.nn.CausalLM` whose input at position t also carries a learned
    embedding of the channel predicted there (``t mod channels``); decoding (prefill, step)
    and the parallel forward both add it, before the embedding dropout:
    ``Drop(token + position + channel)``."""

    def __init__(self, vocab_size: int, max_len: int, *, channels: int, **kwargs: Any) -> None:
        super().__init__(vocab_size, max_len, **kwargs)
        self.channels = channels
        dim = self.embedding.embedding_dim
        self.channel = nn.Embedding(channels, dim)
        nn.init.normal_(self.channel.weight, std=kwargs.get("embedding_std", 0.02))
        # The encoder's embedding dropout moves here, after the channel term; a Dropout holds
        # no state, so the state_dict keys are those of CausalLM plus ``channel.weight``.
        self.embed_dropout = self.encoder.dropout
        self.encoder.add_module("dropout", nn.Identity())

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        x = super().embed(tokens, start)  # token + position, no dropout yet
        which = torch.arange(start, start + tokens.shape[1], device=x.device) % self.channels
        return self.embed_dropout(x + self.channel(which).to(x.dtype))

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(checked_tokens(tokens))
        for layer in self.layers:
            x = layer(x, None, causal=True)
        return self.head(self.encoder.norm(x))


class ImageGenerator(nn.Module):
    """uint8 images ``(B, C, H, W)`` → logits ``(B, L, 256)`` of every sub-pixel given the ones
    before it (L = H·W·C, raster order; see the module docstring).

    Args:
        image_size: H = W, or ``(H, W)``.
        channels: C (3 for RGB, 1 for greyscale).
        dim, depth, num_heads, ffn_dim: the Transformer's shape.
        mechanism, **options: the attention of every layer (it needs ``supports_causal``;
            sampling needs ``supports_recurrent``) and its options. With
            ``rpe="toeplitz2d"`` the model sets ``grid=(H, W·C)`` (a given grid must equal it).
        positions: ``"learned"`` absolute positions (one per sub-pixel) or ``"none"``.
        dropout, attention_dropout: of the blocks (dropout also after the embedding).

    Attributes:
        lm: the :class:`SubPixelLM` over 257 ids (256 values, then the start token), whose
            ``prefill``/``step`` decode sub-pixels and give logits of all 257 ids.
    """

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 32,
        channels: int = 3,
        dim: int = 256,
        depth: int = 4,
        num_heads: int = 4,
        ffn_dim: int = 1024,
        mechanism: str = "softmax",
        positions: str = "learned",
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        self.height, self.width = parse_image_size(image_size)
        self.channels = positive_int("channels", channels)
        if positions not in IMAGE_POSITIONS:
            raise ValueError(f"positions must be one of {IMAGE_POSITIONS}, got {positions!r}")
        self.mechanism = mechanism
        self.length = self.height * self.width * self.channels
        self.grid = (self.height, self.width * self.channels)
        self.lm = SubPixelLM(
            LEVELS + 1,
            self.length,
            channels=self.channels,
            dim=dim,
            depth=depth,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            mechanism=mechanism,
            positions=positions,
            dropout=dropout,
            attention_dropout=attention_dropout,
            **with_grid(mechanism, options, self.grid, what="the sub-pixel grid (H, W·C) ="),
        )

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ImageGenerator:
        """The model of ``GENERATOR_PRESETS[name]`` with ``overrides`` replacing its values."""
        if name not in GENERATOR_PRESETS:
            raise ValueError(
                f"unknown preset {name!r}; presets: {', '.join(sorted(GENERATOR_PRESETS))}"
            )
        return cls(**{**GENERATOR_PRESETS[name], **overrides})

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        return self.channels, self.height, self.width

    # ---------------------------------------------------------------------------- tokens
    def subpixels(self, images: Tensor) -> Tensor:
        """uint8 ``images (B, C, H, W)`` → their sub-pixels ``(B, L)`` int64, raster order."""
        self._check_images(images)
        return raster_subpixels(images)

    def inputs(self, images: Tensor) -> Tensor:
        """The model's input ids ``(B, L)``: the start token, then sub-pixels ``0 … L − 2``."""
        values = self.subpixels(images)
        start = values.new_full((values.shape[0], 1), LEVELS)
        return torch.cat([start, values[:, :-1]], dim=1)

    def images(self, subpixels: Tensor) -> Tensor:
        """Sub-pixels ``(B, L)`` in raster order → uint8 images ``(B, C, H, W)``."""
        shape = (subpixels.shape[0], self.height, self.width, self.channels)
        return subpixels.reshape(shape).permute(0, 3, 1, 2).to(torch.uint8).contiguous()

    # ---------------------------------------------------------------------------- scores
    def forward(self, images: Tensor) -> Tensor:
        """uint8 ``images (B, C, H, W)`` → logits ``(B, L, 256)``; position t sees sub-pixels
        ``< t`` only."""
        return self.lm(self.inputs(images))[..., :LEVELS]

    def nll(self, images: Tensor) -> Tensor:
        """``(B,)``: the mean negative log-likelihood per sub-pixel of each image, in nats."""
        logits = self(images)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp16/bf16 → fp32
        targets = self.subpixels(images)
        nats = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return nats.view(targets.shape).mean(dim=1)

    def bits_per_dim(self, images: Tensor) -> Tensor:
        """The mean over ``images`` of :meth:`nll` in bits: bits/dim (a 0-dim tensor)."""
        return self.nll(images).mean() / math.log(2)

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        return self.lm.regularization_loss()

    # -------------------------------------------------------------------------- sampling
    @property
    def supports_sampling(self) -> bool:
        """Every layer decodes with a state (see :attr:`CausalLM.supports_recurrent`)."""
        return self.lm.supports_recurrent

    @torch.no_grad()
    def sample(
        self, n: int, *, temperature: float = 1.0, generator: torch.Generator | None = None
    ) -> Tensor:
        """``n`` images ``(n, C, H, W)`` uint8, drawn sub-pixel by sub-pixel: one
        :meth:`CausalLM.step` per sub-pixel from the mechanism's decoding state (L steps).

        Args:
            temperature: divides the logits (0: the most likely value at every step).
            generator: the random source (on the model's device; the global RNG if None).

        The model runs in eval mode (its mode is restored afterwards).
        """
        positive_int("n", n)
        check_sampling(temperature, None, None)
        if not self.supports_sampling:
            names = sorted({type(a).__name__ for a in self.lm.attentions()
                            if not a.supports_recurrent})  # fmt: skip
            raise NotImplementedError(
                f"mechanism {self.mechanism!r} ({', '.join(names)}) has no recurrent form "
                "(supports_recurrent is False): sampling draws one sub-pixel per decoding step; "
                "train with it, but sample with a mechanism that can step (see kattn list)"
            )
        was_training = self.training
        self.eval()
        try:
            device = self.lm.head.weight.device
            token = torch.full((n,), LEVELS, dtype=torch.int64, device=device)
            logits, state = self.lm.prefill(token[:, None])
            last = logits[:, 0, :LEVELS]
            drawn = []
            for t in range(self.length):
                token = sample_next(last, temperature=temperature, generator=generator)
                drawn.append(token)
                if t < self.length - 1:
                    step, state = self.lm.step(token, state)
                    last = step[:, :LEVELS]
        finally:
            self.train(was_training)
        return self.images(torch.stack(drawn, dim=1))

    def _check_images(self, images: Tensor) -> None:
        if not isinstance(images, Tensor) or images.dtype != torch.uint8:
            raise TypeError(
                "images must be a uint8 tensor (B, C, H, W) of 8-bit values, got "
                f"{getattr(images, 'dtype', type(images).__name__)}"
            )
        if images.dim() != 4 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(
                f"images must be (B, C, H, W) = (B, {', '.join(map(str, self.image_shape))}), "
                f"got {tuple(images.shape)}"
            )


def raster_subpixels(images: Tensor) -> Tensor:
    """``(B, C, H, W)`` images → their sub-pixels in (row, column, channel) order,
    ``(B, H·W·C)`` int64: the targets of :class:`ImageGenerator`, position by position."""
    return images.permute(0, 2, 3, 1).reshape(images.shape[0], -1).long()
