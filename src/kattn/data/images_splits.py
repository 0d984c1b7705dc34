"""What :func:`~kattn.data.images.load_images` returns: splits of labelled uint8 images.

An :class:`ImageSplit` hands out ``(n, C, H, W)`` uint8 images for the rows asked for, so a
split too large for memory (an ImageNet folder) can decode lazily, while the in-memory formats
(CIFAR, downsampled ImageNet, the embedded set) wrap one tensor: :class:`TensorImageSplit`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

#: the most train images a seeded hold-out gives to valid (downsampled ImageNet, image folders).
HOLDOUT = 10_000
#: the share of train a hold-out takes when that is fewer than :data:`HOLDOUT` images.
HOLDOUT_FRACTION = 0.1


class ImageSplit(ABC):
    """One split: ``len(split)`` images, their ``labels`` and :meth:`images` to read them.

    Attributes:
        labels: ``(N,)`` int64 class ids.
    """

    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @abstractmethod
    def images(self, index: Tensor) -> Tensor:
        """The images of rows ``index``.

        Args:
            index: ``(n,)`` integer row numbers in ``[-N, N)``.

        Returns:
            ``(n, C, H, W)`` uint8.
        """

    def _rows(self, index: Tensor) -> Tensor:
        """``index`` checked and made non-negative (``(n,)`` int64)."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
            raise TypeError(f"index must hold integer row numbers, got dtype {index.dtype}")
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D (n,), got shape {tuple(index.shape)}")
        n = len(self)
        index = index.to(torch.int64)
        if index.numel() and not (-n <= int(index.min()) and int(index.max()) < n):
            raise IndexError(
                f"index holds rows {int(index.min())}..{int(index.max())}; the split has {n}"
            )
        return torch.where(index < 0, index + n, index)


class TensorImageSplit(ImageSplit):
    """A split held in memory: rows of one uint8 ``(N, C, H, W)`` tensor, resized on the way out.

    Args:
        data: ``(N, C, H, W)`` uint8, shared by the splits cut from it (not copied).
        labels: ``(N,)`` class ids of ``data``'s rows.
        rows: the rows of ``data`` in this split, in order (None: all of them).
        size: resize each image handed out to ``size × size`` (:func:`resize_images`); None
            keeps ``H × W``.
    """

    def __init__(
        self, data: Tensor, labels: Tensor, *, rows: Tensor | None = None, size: int | None = None
    ) -> None:
        if data.dtype != torch.uint8 or data.ndim != 4:
            raise ValueError(
                f"data must be (N, C, H, W) uint8, got {data.dtype} of shape {tuple(data.shape)}"
            )
        if labels.shape != (data.shape[0],):
            raise ValueError(f"{tuple(labels.shape)} labels for {data.shape[0]} images")
        self.data = data
        self.row_map = rows
        self.labels = labels.to(torch.int64) if rows is None else labels[rows].to(torch.int64)
        self.size = size

    def images(self, index: Tensor) -> Tensor:
        rows = self._rows(index)
        if self.row_map is not None:
            rows = self.row_map[rows]
        out = self.data[rows]  # (n, C, H, W)
        return out if self.size is None else resize_images(out, self.size)


def resize_images(images: Tensor, size: int) -> Tensor:
    """uint8 images resized to ``size × size``: antialiased bilinear interpolation in float
    (``F.interpolate(..., antialias=True)``, torchvision's default), rounded back to uint8.

    Args:
        images: ``(n, C, H, W)`` uint8.
        size: the side of the output.

    Returns:
        ``(n, C, size, size)`` uint8 (``images`` itself when already that size).
    """
    if images.shape[-2:] == (size, size):
        return images
    if images.shape[0] == 0:
        return images.new_empty((0, images.shape[1], size, size))
    out = F.interpolate(
        images.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
    return out.round_().clamp_(0, 255).to(torch.uint8)


@dataclass
class ImageData:
    """The three splits of an image-classification data set and what it is.

    Attributes:
        train, valid, test: the splits.
        num_classes: labels are in ``[0, num_classes)``.
        classes: the name of each class id.
        channels: C of every image.
        size: ``(H, W)`` of every image handed out.
        source: what a run records about the data: ``format``, ``path``, ``sizes`` of the
            splits, how valid and test were made, any resize, and for the embedded set its
            generator parameters, version and the sha256 of its files.
    """

    train: ImageSplit
    valid: ImageSplit
    test: ImageSplit
    num_classes: int
    classes: list[str]
    channels: int
    size: tuple[int, int]
    source: dict[str, Any] = field(default_factory=dict)


def holdout_size(n: int) -> int:
    """How many of ``n`` train images a seeded hold-out gives to valid: a tenth of them
    (rounded, at least 1) and at most :data:`HOLDOUT` (10,000 of ImageNet's 1.28M)."""
    return min(HOLDOUT, max(1, round(HOLDOUT_FRACTION * n)))


def holdout_rows(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Rows ``0 … n − 1`` split into train and valid (:func:`holdout_size` rows, drawn by
    ``numpy.random.default_rng(seed).permutation(n)``), each sorted so that both keep the
    files' order. The caller checks that ``1 <= holdout_size(n) < n``."""
    order = np.random.default_rng(seed).permutation(n)
    held = holdout_size(n)
    return torch.from_numpy(np.sort(order[held:])), torch.from_numpy(np.sort(order[:held]))


def holdout_note(n: int, seed: int) -> str:
    """How :func:`holdout_rows` made valid, for ``source["valid"]``."""
    return (
        f"a random {holdout_size(n)} of {n} train images (numpy default_rng({seed}); "
        f"{HOLDOUT_FRACTION:.0%} of train, at most {HOLDOUT:,}), the rest is train"
    )


def split_sizes(train: ImageSplit, valid: ImageSplit, test: ImageSplit) -> dict[str, int]:
    """``{"train": N, "valid": N, "test": N}`` for ``source``."""
    return {"train": len(train), "valid": len(valid), "test": len(test)}
