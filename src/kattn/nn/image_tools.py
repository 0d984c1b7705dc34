"""What an image model's results need besides the model: the bits/dim of histogram baselines,
and PNG files of its samples written without an imaging library.

Bits/dim is the negative log-likelihood of a sub-pixel in bits, averaged over the sub-pixels
of the test images (Luo et al. 2021, Appendix A.5, Table 6); a uniform model scores 8. The
histograms are the floor any generative model should beat: one distribution of all 8-bit
values, and one per (channel, row, column) position, fitted with add-one (Laplace)
smoothing so that no test value has probability 0.

The PNG writer follows the PNG specification (W3C, 2003): the signature, an ``IHDR`` chunk
(8-bit greyscale or RGB, no interlacing), one ``IDAT`` chunk (every row prefixed with filter
type 0 and the whole deflated by zlib), ``IEND``; each chunk closed by the CRC-32 of its type
and data.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable
from os import PathLike
from pathlib import Path

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int

#: values of an 8-bit sub-pixel.
LEVELS = 256
#: the first eight bytes of every PNG file.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour types by number of channels: greyscale (0) and RGB (2).
_COLOUR_TYPES = {1: 0, 3: 2}
#: images counted at once when a whole tensor is given (their values are widened to int64).
HISTOGRAM_CHUNK = 1024


def histogram_bits_per_dim(
    train: Tensor | Iterable[Tensor], test: Tensor | Iterable[Tensor]
) -> dict[str, float]:
    """Bits/dim on ``test`` of two histograms fitted on ``train`` with add-one smoothing.

    ``p(v) = (n_v + 1) / (N + 256)`` with ``n_v`` the training count of value v among N:

    * ``"marginal"``: one histogram of every sub-pixel value of every training image;
    * ``"per_position"``: one histogram for each (channel, row, column).

    Both splits are read chunk by chunk into counts (256 per position, ``C·H·W·256`` in
    all), only a chunk at a time widened to int64, and the test score is the dot product of
    the test counts with ``−log2 p``: a split never needs to be in memory at once (ImageNet32's
    train split as int64 would take 31 GB), and the result does not depend on the chunks.

    Args:
        train: uint8 ``(N, C, H, W)``, or an iterable of such chunks (``(n, C, H, W)``, one
            ``(C, H, W)`` for all), N >= 1 in all; test: the same for the ``M >= 1`` images
            scored.

    Returns:
        ``{"marginal": bits, "per_position": bits}``: the mean over test sub-pixels of
        ``−log2 p``.
    """
    train_counts, n_train, shape = _position_counts("train", train, None)
    positions = train_counts.shape[0]
    test_counts, n_test, _ = _position_counts("test", test, shape)
    marginal = train_counts.sum(0).double()  # (256,)
    log_p = torch.log((marginal + 1) / (marginal.sum() + LEVELS))
    marginal_nats = -(test_counts.sum(0).double() * log_p).sum()
    log_p = torch.log((train_counts.double() + 1) / (n_train + LEVELS))  # (positions, 256)
    position_nats = -(test_counts.double() * log_p).sum()
    scored = n_test * positions * math.log(2)
    return {
        "marginal": float(marginal_nats / scored),
        "per_position": float(position_nats / scored),
    }


def _position_counts(
    name: str, images: Tensor | Iterable[Tensor], shape: tuple[int, ...] | None
) -> tuple[Tensor, int, tuple[int, ...]]:
    """The count of each value at each position, ``(C·H·W, 256)`` int64, the number of
    images and their ``(C, H, W)``, over the chunks of ``images``; ``shape``: the
    ``(C, H, W)`` they must have (train's), or None."""
    chunks: Iterable[Tensor] = (
        images.split(HISTOGRAM_CHUNK) if isinstance(images, Tensor) else images
    )
    counts: Tensor | None = None
    offsets: Tensor | None = None
    seen: tuple[int, ...] | None = None
    total = 0
    for chunk in chunks:
        _check_images(name, chunk, empty=True)
        if seen is None:
            seen = tuple(chunk.shape[1:])
            if shape is not None and seen != shape:
                raise ValueError(
                    f"train and test images must share (C, H, W), got {shape} and {seen}"
                )
            positions = math.prod(seen)
            counts = torch.zeros(positions * LEVELS, dtype=torch.int64)
            offsets = torch.arange(positions) * LEVELS  # one block of 256 per position
        elif tuple(chunk.shape[1:]) != seen:
            raise ValueError(
                f"the chunks of {name} must share (C, H, W), got {seen} and "
                f"{tuple(chunk.shape[1:])}"
            )
        assert counts is not None and offsets is not None
        values = chunk.flatten(1).cpu().long()  # (n, C·H·W), this chunk only
        counts += torch.bincount((values + offsets).flatten(), minlength=counts.numel())
        total += chunk.shape[0]
    if counts is None or seen is None or total == 0:
        raise ValueError(f"{name} must hold images (N, C, H, W) with N >= 1, got none")
    return counts.view(-1, LEVELS), total, seen


def image_grid(images: Tensor, nrow: int = 8, *, padding: int = 2, pad_value: int = 0) -> Tensor:
    """uint8 ``images (N, C, H, W)`` tiled into one image ``(C, H', W')``, ``nrow`` images per
    row, ``padding`` pixels of ``pad_value`` around and between them (the layout of
    torchvision's ``make_grid``): ``H' = rows·(H + padding) + padding`` with
    ``rows = ⌈N / nrow⌉``, ``W' = min(N, nrow)·(W + padding) + padding``."""
    _check_images("images", images)
    positive_int("nrow", nrow)
    int_at_least("padding", padding, 0)
    if not (isinstance(pad_value, int) and 0 <= pad_value < LEVELS):
        raise ValueError(f"pad_value must be an int in [0, 255], got {pad_value!r}")
    n, c, h, w = images.shape
    columns, rows = min(n, nrow), -(-n // nrow)
    grid = images.new_full(
        (c, rows * (h + padding) + padding, columns * (w + padding) + padding), pad_value
    )
    for i in range(n):
        top = (i // nrow) * (h + padding) + padding
        left = (i % nrow) * (w + padding) + padding
        grid[:, top : top + h, left : left + w] = images[i]
    return grid


def write_png(path: str | PathLike[str], image: Tensor, nrow: int = 8) -> Path:
    """Write ``image`` as an 8-bit PNG file; returns the path.

    Args:
        path: the file to write (its folder must exist).
        image: uint8 ``(C, H, W)`` with C = 1 (greyscale) or 3 (RGB), or a batch
            ``(N, C, H, W)``, written as :func:`image_grid` with ``nrow`` images per row.
    """
    if isinstance(image, Tensor) and image.dim() == 4:
        image = image_grid(image, nrow)
    if not isinstance(image, Tensor) or image.dtype != torch.uint8 or image.dim() != 3:
        raise ValueError(
            "image must be a uint8 tensor (C, H, W) or (N, C, H, W), got "
            f"{getattr(image, 'dtype', type(image).__name__)} "
            f"{tuple(getattr(image, 'shape', ()))}"
        )
    c, h, w = image.shape
    if c not in _COLOUR_TYPES:
        raise ValueError(f"a PNG image has 1 (greyscale) or 3 (RGB) channels, got C={c}")
    if h == 0 or w == 0:
        raise ValueError(f"a PNG image needs at least one pixel, got H={h}, W={w}")
    pixels = image.permute(1, 2, 0).reshape(h, w * c).cpu()  # rows of interleaved channels
    rows = torch.cat([torch.zeros(h, 1, dtype=torch.uint8), pixels], dim=1)  # filter type 0
    header = struct.pack(">IIBBBBB", w, h, 8, _COLOUR_TYPES[c], 0, 0, 0)
    data = b"".join((
        PNG_SIGNATURE,
        _chunk(b"IHDR", header),
        _chunk(b"IDAT", zlib.compress(rows.numpy().tobytes(), 9)),
        _chunk(b"IEND", b""),
    ))  # fmt: skip
    out = Path(path)
    out.write_bytes(data)
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk: length, type, data, CRC-32 of type and data (all big-endian)."""
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _check_images(name: str, images: Tensor, *, empty: bool = False) -> None:
    """``TypeError`` unless uint8, ``ValueError`` unless ``(N, C, H, W)`` with ``N >= 1`` (or
    ``N = 0`` when ``empty``)."""
    if not isinstance(images, Tensor) or images.dtype != torch.uint8:
        raise TypeError(
            f"{name} must be a uint8 tensor (N, C, H, W), got "
            f"{getattr(images, 'dtype', type(images).__name__)}"
        )
    if images.dim() != 4 or (images.shape[0] == 0 and not empty):
        raise ValueError(
            f"{name} must be (N, C, H, W) with N >= 1, got shape {tuple(images.shape)}"
        )
