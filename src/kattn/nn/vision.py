"""A Vision Transformer (ViT/DeiT) whose attention is any registered mechanism, with 2-D
relative positions for kernelized attention.

Images ``(B, C, H, W)`` are cut into ``p×p`` patches by a ``Conv2d`` with kernel and stride
``p`` (Dosovitskiy et al. 2021), giving ``L = (H/p)·(W/p)`` tokens in row-major order; then
learned absolute positions (optional), :class:`~kattn.nn.encoder.EncoderLayer` blocks with
stochastic depth rising linearly over the layers (DeiT: Touvron et al. 2021), a final
LayerNorm, global average pooling over the patches (or a class token) and a linear head.

Luo et al. 2021, §4.4 (Table 4) train DeiT-base with NPRF attention and the 2-D relative
positional encoding of the Swin Transformer (Liu et al. 2021): ``mechanism="nprf_rpe",
rpe="toeplitz2d"``, M = 32 random features (``num_features=32``); the model sets the encoding's
``grid`` to the patch grid. Following Swin, the head reads the mean of the patch outputs: a
class token is not a cell of the grid, so it has no 2-D offset to the patches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import positional
from ..checks import boolean, is_positive_int
from ..registry import spec
from .encoder import DropPath, EncoderLayer, attention_penalties, shared_rpe_options
from .image_grid import IMAGE_POSITIONS, planar_encoding, with_grid
from .image_grid import image_size as parse_image_size

#: ``pooling`` options of :class:`VisionTransformer`.
POOLINGS = ("gap", "cls")

#: Model sizes. The DeiT ones (Touvron et al. 2021, Table 1) take 224×224 images in 16×16
#: patches, 1,000 classes and stochastic depth 0.1; ``small`` is a CPU-sized model for 32×32
#: images (CIFAR-10) in 4×4 patches. The kernelized runs of Luo et al. 2021, §4.4 use
#: M = 32 random features: add ``mechanism="nprf_rpe", rpe="toeplitz2d", num_features=32``.
#: Every preset keeps the model's default ``pooling="gap"``, global average pooling over the
#: patches: the paper's choice (Luo et al. 2021, Appendix A.4, following Swin), not DeiT's
#: class token, so ``deit-*`` are DeiT's sizes rather than DeiT's exact models; add
#: ``pooling="cls"`` for those (with learned positions and no 2-D relative encoding).
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "deit-tiny": {"image_size": 224, "patch_size": 16, "num_classes": 1000, "dim": 192,
                  "num_layers": 12, "num_heads": 3, "ffn_dim": 768, "drop_path": 0.1},
    "deit-small": {"image_size": 224, "patch_size": 16, "num_classes": 1000, "dim": 384,
                   "num_layers": 12, "num_heads": 6, "ffn_dim": 1536, "drop_path": 0.1},
    "deit-base": {"image_size": 224, "patch_size": 16, "num_classes": 1000, "dim": 768,
                  "num_layers": 12, "num_heads": 12, "ffn_dim": 3072, "drop_path": 0.1},
    "small": {"image_size": 32, "patch_size": 4, "num_classes": 10, "dim": 64,
              "num_layers": 4, "num_heads": 4, "ffn_dim": 128, "drop_path": 0.1},
}  # fmt: skip


class VisionTransformer(nn.Module):
    """Images ``(B, C, H, W)`` → logits ``(B, num_classes)`` (see the module docstring).

    Args:
        image_size: ``H = W``, or ``(H, W)``; both multiples of ``patch_size``.
        patch_size: side of the square patches (1: one token per pixel).
        in_channels: C; num_classes: outputs of the head.
        dim, num_layers, num_heads, ffn_dim: the shape of the blocks.
        mechanism, **options: the attention of every block and its options, as
            ``kattn.build`` takes them (e.g. ``rpe="toeplitz2d", num_features=32``). For an
            encoding on a 2-D grid the model sets ``grid=(H/p, W/p)``; a ``grid`` given
            here must equal it.
        pooling: ``"gap"``, the mean of the patch outputs (Swin, and Luo et al. 2021, §4.4),
            or ``"cls"``, a learned class token prepended to the patches (ViT, DeiT); not
            with a 2-D relative encoding.
        positions: ``"learned"`` absolute positions of the tokens (DeiT) or ``"none"``.
        rpe_shared: build a named relative encoding once, shared by every block, or one per
            block (False).
        drop_path: the top rate of stochastic depth: block i of n (from 0) drops its
            residual branches with probability ``drop_path · i / (n − 1)``, DeiT's
            ``linspace(0, drop_path, n)``, so the last block of several gets ``drop_path``
            and a single block 0.
        dropout: after the positions, on the attention output and in the MLP;
            attention_dropout: on the attention weights (mechanisms that have them).
        norm_first: pre-LN blocks and a final LayerNorm (default), or post-LN blocks.
    """

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        num_classes: int = 10,
        dim: int = 64,
        num_layers: int = 4,
        num_heads: int = 4,
        ffn_dim: int = 128,
        mechanism: str = "softmax",
        pooling: str = "gap",
        positions: str = "learned",
        rpe_shared: bool = True,
        drop_path: float = 0.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if positions not in IMAGE_POSITIONS:
            raise ValueError(f"positions must be one of {IMAGE_POSITIONS}, got {positions!r}")
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes),
                            ("num_layers", num_layers)):  # fmt: skip
            if not is_positive_int(value):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        boolean("rpe_shared", rpe_shared)
        top_rate = DropPath(drop_path).p  # DropPath checks the rate
        self.image_size = parse_image_size(image_size)
        self.grid = patch_grid(self.image_size, patch_size)
        self.in_channels, self.pooling = in_channels, pooling
        num_patches = self.grid[0] * self.grid[1]
        num_tokens = num_patches + int(pooling == "cls")
        options = _with_grid(mechanism, options, self.grid, pooling, rpe_shared)
        if rpe_shared:
            options = shared_rpe_options(mechanism, num_heads, num_tokens, options)

        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls: nn.Parameter | None = None
        if pooling == "cls":
            self.cls = nn.Parameter(nn.init.trunc_normal_(torch.zeros(dim), std=0.02))
        self.position: nn.Parameter | None = None
        if positions == "learned":
            table = torch.zeros(num_tokens, dim)
            self.position = nn.Parameter(nn.init.trunc_normal_(table, std=0.02))
        self.dropout = nn.Dropout(dropout)
        last = max(num_layers - 1, 1)
        self.layers = nn.ModuleList(
            EncoderLayer(
                dim,
                num_heads,
                ffn_dim,
                mechanism=mechanism,
                max_len=num_tokens,
                dropout=dropout,
                attention_dropout=attention_dropout,
                norm_first=norm_first,
                drop_path=top_rate * (i / last),
                **options,
            )
            for i in range(num_layers)
        )
        self.norm = nn.LayerNorm(dim) if norm_first else nn.Identity()
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def patchify(self, images: Tensor) -> Tensor:
        """The patch embeddings ``(B, L, dim)``, ``L = h·w`` in row-major order of the grid."""
        c, (h, w) = self.in_channels, self.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (c, h, w):
            raise ValueError(
                f"images must be (B, {c}, {h}, {w}) (image_size={self.image_size}, "
                f"in_channels={c}), got {tuple(images.shape)}"
            )
        if not images.is_floating_point():
            raise TypeError(
                f"images must be a float tensor, normalised by the caller; got {images.dtype}"
            )
        return self.patch_embed(images).flatten(2).transpose(1, 2)

    def forward_features(self, images: Tensor) -> Tensor:
        """``(B, L, dim)`` outputs after the final LayerNorm (``L + 1`` with ``pooling="cls"``,
        the class token first)."""
        x = self.patchify(images)
        if self.cls is not None:
            x = torch.cat([self.cls.to(x.dtype).expand(x.shape[0], 1, -1), x], dim=1)
        if self.position is not None:
            x = x + self.position.to(x.dtype)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``(B, num_classes)`` of float images ``(B, C, H, W)``."""
        x = self.forward_features(images)
        pooled = x[:, 0] if self.pooling == "cls" else x.mean(dim=1)
        return self.head(pooled)

    def regularization_loss(self) -> Tensor:
        """Sum of the attention mechanisms' penalties (0 for most mechanisms)."""
        return attention_penalties(self.layers, self.head.weight.device)


def vision_transformer(preset: str, **overrides: Any) -> VisionTransformer:
    """The :data:`VIT_PRESETS` model ``preset`` with ``overrides`` (any argument of
    :class:`VisionTransformer`, e.g. ``mechanism="nprf_rpe", rpe="toeplitz2d",
    num_features=32``) replacing or adding to its settings."""
    if preset not in VIT_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; the presets are {sorted(VIT_PRESETS)}")
    return VisionTransformer(**{**VIT_PRESETS[preset], **overrides})


def patch_grid(image_size: tuple[int, int], patch_size: int) -> tuple[int, int]:
    """``(H/p, W/p)``: the patches along each side (``ValueError`` unless both divide)."""
    if not is_positive_int(patch_size):
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
    h, w = image_size
    if h % patch_size or w % patch_size:
        raise ValueError(
            f"image_size {image_size} is not divisible by patch_size {patch_size}: the patches "
            "must tile the image"
        )
    return h // patch_size, w // patch_size


def _with_grid(
    mechanism: str,
    options: dict[str, Any],
    grid: tuple[int, int],
    pooling: str,
    rpe_shared: bool,
) -> dict[str, Any]:
    """``options`` with ``grid`` set for a 2-D relative encoding
    (:func:`~kattn.nn.image_grid.with_grid`); refuses an encoding module with
    ``rpe_shared=False`` and the class token with a 2-D encoding."""
    rpe = {**spec(mechanism).defaults, **options}.get("rpe")
    if isinstance(rpe, positional.RelativePositionBias) and not rpe_shared:
        raise ValueError(
            "rpe_shared=False builds one relative encoding per block, but rpe is a module "
            "already (one encoding for every block): pass the encoding's name instead"
        )
    options = with_grid(mechanism, options, grid, what="the patch grid")
    planar = planar_encoding(mechanism, options)
    if planar is not None and pooling == "cls":
        name = planar if isinstance(planar, str) else type(planar).__name__
        raise ValueError(
            f"pooling='cls' cannot be used with the 2-D relative encoding {name!r}: the class "
            "token is not a cell of the patch grid, so it has no (Δrow, Δcol) offset to the "
            "patches; use pooling='gap' (the mean of the patch outputs, as Luo et al. 2021, "
            "§4.4 following Swin)"
        )
    return options
