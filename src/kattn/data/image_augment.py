"""Train-time augmentation of uint8 image batches, in torch (DeiT's recipe, Touvron et al. 2021).

:class:`Augment` turns a batch ``(n, C, H, W)`` uint8 and its labels into floats in ``[0, 1]``
of ``image_size × image_size`` and targets, in this order (timm's):

1. Random resized crop (Szegedy et al. 2015, §6; torchvision's ``RandomResizedCrop``
   sampling, :func:`random_resized_crop_params`), each crop resized with
   ``F.interpolate(mode="bilinear", antialias=True)``.
2. Horizontal flip with probability 1/2.
3. RandAugment (Cubuk et al. 2020), only through torchvision's ``transforms.v2.RandAugment``
   (the ``vision`` extra), per image. Its magnitude counts in tenths of each operation's range
   (:data:`RANDAUGMENT_BINS` = 11 bins, 0 … 10), as timm's ``rand-mM`` that DeiT uses
   (``rand-m9-mstd0.5-inc1``; timm's magnitudes are out of 10), so ``(2, 9)`` is DeiT's
   strength; torchvision's default of 31 bins would make magnitude 9 about three times
   weaker. (timm's per-draw magnitude noise, ``mstd0.5``, is not reproduced.) torchvision
   draws from torch's CPU generator, which is forked and seeded from the given generator
   for the call; no other generator (CUDA's, used by dropout and random-feature redraws) is
   touched.
4. Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019), as timm's batch mode does: one
   ``λ ~ Beta(α, α)`` per batch, every image mixed with its partner in the batch reversed
   (``x.flip(0)``). Mixup blends ``λ·x + (1 − λ)·x.flip(0)``; CutMix pastes a box of
   ``x.flip(0)`` of area about ``1 − λ`` (centre uniform, clipped at the border) and sets
   ``λ`` to the unpasted fraction. With both on, each batch uses one of them with
   probability 1/2 (timm's ``switch_prob``). Targets are then soft:
   ``λ·onehot(y) + (1 − λ)·onehot(y.flip(0))``; without either they are the labels.

:func:`normalize` with :data:`IMAGENET_MEAN` and :data:`IMAGENET_STD` follows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import is_positive_int, positive_int

#: ImageNet's per-channel mean and standard deviation of RGB in [0, 1] (torchvision, timm).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the aspect ratios (w / h) a random resized crop draws from, log-uniformly.
CROP_RATIO = (3 / 4, 4 / 3)
#: RandAugment's ``num_magnitude_bins``: magnitudes 0 … 10, each a tenth of an operation's
#: range, as timm's (whose ``rand-m9`` DeiT trains with).
RANDAUGMENT_BINS = 11
_CROP_TRIES = 10


def normalize(
    batch: Tensor,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> Tensor:
    """``(batch − mean) / std`` per channel of a ``(n, C, H, W)`` float batch."""
    if batch.ndim != 4 or batch.shape[1] != len(mean) or len(mean) != len(std):
        raise ValueError(
            f"normalize needs (n, C, H, W) with C = len(mean) = len(std), got shape "
            f"{tuple(batch.shape)} and {len(mean)} means, {len(std)} stds"
        )
    m = torch.tensor(mean, dtype=batch.dtype, device=batch.device)[:, None, None]
    s = torch.tensor(std, dtype=batch.dtype, device=batch.device)[:, None, None]
    return (batch - m) / s


def random_resized_crop_params(
    height: int,
    width: int,
    scale: tuple[float, float],
    generator: torch.Generator,
    ratio: tuple[float, float] = CROP_RATIO,
) -> tuple[int, int, int, int]:
    """A crop ``(top, left, h, w)`` drawn as torchvision's ``RandomResizedCrop.get_params``.

    Up to 10 tries: area ``A·U(scale)``, aspect ``w/h = exp(U(log ratio))``, ``w`` and ``h``
    rounded; the first that fits is placed uniformly. Otherwise the centre crop of the whole
    image clipped to the ratio range.
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(_CROP_TRIES):
        u = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
        target = area * (scale[0] + u[0] * (scale[1] - scale[0]))
        aspect = math.exp(log_ratio[0] + u[1] * (log_ratio[1] - log_ratio[0]))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class Augment:
    """Random resized crop, flip, RandAugment, mixup/CutMix (see the module docstring).

    Args:
        image_size: the side of the output images.
        crop_scale: the range of the crop's area as a fraction of the image's.
        flip: flip horizontally with probability 1/2.
        randaugment: ``(num_ops, magnitude)`` of RandAugment (needs torchvision), or None;
            the magnitude is out of 10, as timm's ``rand-mM`` (DeiT: ``(2, 9)``).
        mixup: α of mixup's Beta(α, α); 0 turns it off.
        cutmix: α of CutMix's Beta(α, α); 0 turns it off.
        num_classes: the width of soft targets.
    """

    def __init__(
        self,
        image_size: int,
        *,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        flip: bool = True,
        randaugment: tuple[int, int] | None = None,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        num_classes: int,
    ) -> None:
        positive_int("image_size", image_size)
        lo, hi = crop_scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
        for name, alpha in (("mixup", mixup), ("cutmix", cutmix)):
            if not alpha >= 0:
                raise ValueError(f"{name} is the α of Beta(α, α), it must be >= 0; got {alpha}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.image_size = image_size
        self.crop_scale = (float(lo), float(hi))
        self.flip = flip
        self.mixup = float(mixup)
        self.cutmix = float(cutmix)
        self.num_classes = num_classes
        self.randaugment = None if randaugment is None else _randaugment(*randaugment)

    def __call__(
        self, images: Tensor, labels: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Augment a batch.

        Args:
            images: ``(n, C, H, W)`` uint8.
            labels: ``(n,)`` class ids.
            generator: a CPU generator: every random choice is drawn from it.

        Returns:
            Images ``(n, C, image_size, image_size)`` float in ``[0, 1]``, and targets:
            ``(n, num_classes)`` float summing to 1 with mixup or CutMix, else ``labels``.
        """
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(
                f"Augment takes (n, C, H, W) uint8 images, got {images.dtype} of shape "
                f"{tuple(images.shape)}"
            )
        if labels.shape != (images.shape[0],):
            raise ValueError(f"{tuple(labels.shape)} labels for {images.shape[0]} images")
        out = self._crop_and_flip(images, generator)
        if self.randaugment is not None:
            out = self._randaugment(out, generator)
        if not (self.mixup or self.cutmix):
            return out, labels
        if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < self.num_classes:
            raise ValueError(f"labels must be in [0, {self.num_classes}) for soft targets")
        return self._mix(out, labels, generator)

    def _crop_and_flip(self, images: Tensor, generator: torch.Generator) -> Tensor:
        n, c, height, width = images.shape
        size = self.image_size
        out = torch.empty(n, c, size, size, device=images.device)
        flips = torch.rand(n, generator=generator) < 0.5
        for i in range(n):
            top, left, h, w = random_resized_crop_params(height, width, self.crop_scale, generator)
            crop = images[i : i + 1, :, top : top + h, left : left + w].float()
            if (h, w) != (size, size):
                crop = F.interpolate(
                    crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True
                )
            out[i] = crop[0]
            if self.flip and flips[i]:
                out[i] = out[i].flip(-1)
        return out.clamp_(0, 255).div_(255)

    def _randaugment(self, batch: Tensor, generator: torch.Generator) -> Tensor:
        assert self.randaugment is not None
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        pixels = (batch * 255).round_().to(torch.uint8)
        # Only the CPU generator, which torchvision draws from: torch.manual_seed would also
        # reseed every CUDA generator, and fork_rng(devices=[]) would not restore those.
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            pixels = torch.stack([self.randaugment(image) for image in pixels])
        return pixels.float().div_(255)

    def _mix(
        self, batch: Tensor, labels: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        use_cutmix = self.cutmix > 0 and (
            self.mixup == 0 or bool(torch.rand(1, generator=generator) < 0.5)
        )
        alpha = self.cutmix if use_cutmix else self.mixup
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        lam = float(np.random.default_rng(seed).beta(alpha, alpha))
        partner = batch.flip(0)
        if use_cutmix:
            top, bottom, left, right = _cutmix_box(batch.shape[-2], batch.shape[-1], lam, generator)
            batch = batch.clone()
            batch[..., top:bottom, left:right] = partner[..., top:bottom, left:right]
            lam = 1 - (bottom - top) * (right - left) / (batch.shape[-2] * batch.shape[-1])
        else:
            batch = batch * lam + partner * (1 - lam)
        onehot = F.one_hot(labels.long(), self.num_classes).to(batch.dtype)
        return batch, onehot * lam + onehot.flip(0) * (1 - lam)


def _cutmix_box(
    height: int, width: int, lam: float, generator: torch.Generator
) -> tuple[int, int, int, int]:
    """timm's ``rand_bbox``: a box of sides ``√(1 − λ)·(H, W)`` around a uniform centre,
    clipped to the image: ``(top, bottom, left, right)``."""
    cut = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy = int(torch.randint(0, height, (1,), generator=generator))
    cx = int(torch.randint(0, width, (1,), generator=generator))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
    return top, bottom, left, right


def _randaugment(num_ops: int, magnitude: int) -> Any:
    """torchvision's RandAugment with :data:`RANDAUGMENT_BINS` bins (magnitude out of 10)."""
    if not is_positive_int(num_ops):
        raise ValueError(f"randaugment's num_ops must be a positive int, got {num_ops!r}")
    top = RANDAUGMENT_BINS - 1
    if isinstance(magnitude, bool) or not isinstance(magnitude, int) or not 0 <= magnitude <= top:
        raise ValueError(
            f"randaugment's magnitude must be an int in [0, {top}] (tenths of each "
            f"operation's range, as timm's rand-mM; DeiT uses 9), got {magnitude!r}"
        )
    try:
        from torchvision.transforms import v2
    except ImportError as err:
        raise ImportError(
            "randaugment uses torchvision's transforms.v2.RandAugment: pip install 'kattn[vision]'"
        ) from err
    return v2.RandAugment(num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=RANDAUGMENT_BINS)
