"""Downsampled ImageNet (Chrabaszcz, Loshchilov and Hutter 2017, "A downsampled variant of
ImageNet as an alternative to the CIFAR datasets"): the ImageNet16/32/64 releases.

A release is ``train_data_batch_1`` … ``train_data_batch_10`` and ``val_data``, each either a
``.npz`` (the ``*_npz`` archives) or an extension-less pickle of the same dict: ``data``
``(N, 3·s·s)`` uint8, every row the R, G and B planes of an ``s × s`` image (row-major),
``labels`` 1–1000 (1-based), and an optional ``mean``. The archives unpack to separate train
and val folders, so each file is looked for in the given folder and in its direct subfolders.
``.npz`` files are read with ``allow_pickle=False`` and pickles through
:func:`~kattn.data.safe_pickle.load_pickle`.

Splits: test is ``val_data`` (50,000 images); valid is a seeded random hold-out of
:data:`~kattn.data.images_splits.HOLDOUT` (10,000) train images (a tenth of train when that is
fewer, as in tests; :func:`~kattn.data.images_splits.holdout_rows`), and train the rest, both
kept in file order. Class ``k`` is named by the release's label, ``str(k + 1)``.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .base import DataFormatError
from .images_cifar import check_labels
from .images_splits import (
    ImageData,
    TensorImageSplit,
    holdout_note,
    holdout_rows,
    holdout_size,
    split_sizes,
)
from .safe_pickle import load_pickle

TRAIN_BATCHES = tuple(f"train_data_batch_{i}" for i in range(1, 11))
VAL_FILE = "val_data"
NUM_CLASSES = 1000


def find_downsampled(data_dir: Path) -> dict[str, Path] | None:
    """Where each file of a release lies (``name → path``, ``.npz`` or not), or None when
    neither ``train_data_batch_1`` nor ``val_data`` is in ``data_dir`` or a direct subfolder.

    Raises:
        DataFormatError: a release was found but one of its files is missing (named).
    """
    folders = [data_dir, *sorted(p for p in data_dir.iterdir() if p.is_dir())]
    found: dict[str, Path] = {}
    for name in (*TRAIN_BATCHES, VAL_FILE):
        for folder in folders:
            hits = [folder / f"{name}.npz", folder / name]
            hit = next((p for p in hits if p.is_file()), None)
            if hit is not None:
                found[name] = hit
                break
    if TRAIN_BATCHES[0] not in found and VAL_FILE not in found:
        return None
    missing = [name for name in (*TRAIN_BATCHES, VAL_FILE) if name not in found]
    if missing:
        raise DataFormatError(
            f"downsampled ImageNet in {data_dir} lacks {', '.join(missing)} (.npz or a pickle "
            f"without extension): expected {TRAIN_BATCHES[0]} … {TRAIN_BATCHES[-1]} and "
            f"{VAL_FILE}, in the folder or its direct subfolders"
        )
    return found


def read_downsampled_file(path: Path) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Rows ``(N, 3·s·s)`` uint8 and 0-based labels ``(N,)`` of one file of the release.

    Raises:
        DataFormatError: the file is unreadable or truncated, lacks ``data`` or ``labels``, its
            rows are not ``3·s·s`` uint8, or a label is outside 1–1000 (the message names the
            file).
    """
    batch = _read_npz(path) if path.suffix == ".npz" else _read_pickle(path)
    data, labels = batch["data"], batch["labels"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2):
        raise DataFormatError(
            f"{path}: 'data' must be a (N, 3·s·s) uint8 array, got {type(data).__name__} of "
            f"shape {getattr(data, 'shape', None)} and dtype {getattr(data, 'dtype', None)}"
        )
    side = math.isqrt(data.shape[1] // 3)
    if data.shape[1] == 0 or 3 * side * side != data.shape[1]:
        raise DataFormatError(
            f"{path}: rows of {data.shape[1]} bytes are not the R, G and B planes of a square "
            f"image (3·s·s: 768, 3072 or 12288 for ImageNet16, 32 and 64)"
        )
    one_based = check_labels(path, labels, data.shape[0], NUM_CLASSES, key="'labels'", first=1)
    return data, one_based - 1


def load_downsampled(
    files: dict[str, Path], data_dir: Path, *, image_size: int | None, seed: int
) -> ImageData:
    """The release as :class:`ImageData` (see the module docstring for the splits)."""
    rows, labels = [], []
    side = None
    for name in TRAIN_BATCHES:
        data, batch_labels = read_downsampled_file(files[name])
        side = _check_side(files[name], data, side)
        rows.append(data)
        labels.append(batch_labels)
    test_rows, test_labels = read_downsampled_file(files[VAL_FILE])
    side = _check_side(files[VAL_FILE], test_rows, side)
    assert side is not None
    train = _to_images(np.concatenate(rows), side)
    del rows
    train_labels = torch.from_numpy(np.concatenate(labels))
    n = len(train_labels)
    held = holdout_size(n)
    if held >= n or len(test_labels) == 0:
        raise DataFormatError(
            f"downsampled ImageNet in {data_dir}: {n} train and {len(test_labels)} val images "
            f"leave a split empty (valid holds out {held} of train)"
        )
    train_rows, valid_rows = holdout_rows(n, seed)
    splits = (
        TensorImageSplit(train, train_labels, rows=train_rows, size=image_size),
        TensorImageSplit(train, train_labels, rows=valid_rows, size=image_size),
        TensorImageSplit(
            _to_images(test_rows, side), torch.from_numpy(test_labels), size=image_size
        ),
    )
    out = image_size or side
    source: dict[str, Any] = {
        "format": "downsampled-imagenet",
        "path": str(data_dir),
        "files": {name: str(path) for name, path in files.items()},
        "sizes": split_sizes(*splits),
        "stored_size": [side, side],
        "resize": _resize_note(side, image_size),
        "valid": holdout_note(n, seed),
        "test": VAL_FILE,
    }
    return ImageData(
        *splits,
        num_classes=NUM_CLASSES,
        classes=[str(k + 1) for k in range(NUM_CLASSES)],
        channels=3,
        size=(out, out),
        source=source,
    )


def _resize_note(side: int, image_size: int | None) -> str | None:
    if image_size is None or image_size == side:
        return None
    return f"{side}x{side} -> {image_size}x{image_size}, antialiased bilinear (torch)"


def _to_images(rows: npt.NDArray[np.uint8], side: int) -> torch.Tensor:
    return torch.from_numpy(rows).view(len(rows), 3, side, side)


def _check_side(path: Path, data: npt.NDArray[np.uint8], side: int | None) -> int:
    this = math.isqrt(data.shape[1] // 3)
    if side is not None and this != side:
        raise DataFormatError(
            f"{path}: holds {this}x{this} images, the files before it {side}x{side}"
        )
    return this


def _read_npz(path: Path) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            missing = {"data", "labels"} - keys
            if missing:
                raise DataFormatError(
                    f"{path}: the .npz lacks {', '.join(sorted(missing))} (has "
                    f"{', '.join(sorted(keys)) or 'nothing'}); expected data, labels and mean"
                )
            return {"data": npz["data"], "labels": npz["labels"]}
    except DataFormatError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise DataFormatError(
            f"{path} is not a readable downsampled ImageNet .npz: {err}"
        ) from None


def _read_pickle(path: Path) -> dict[str, Any]:
    batch = load_pickle(
        path, what="downsampled ImageNet batch", expected="a pickled dict with data and labels"
    )
    if isinstance(batch, dict):
        batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if not isinstance(batch, dict) or not {"data", "labels"} <= batch.keys():
        got = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise DataFormatError(f"{path}: expected a dict with keys data and labels, got {got}")
    return batch
