"""CIFAR-10 and CIFAR-100 in their python release (Krizhevsky 2009, "Learning multiple layers
of features from tiny images"): reading, and writing CIFAR-10's layout for the embedded set.

CIFAR-10 (``cifar-10-python.tar.gz`` → ``cifar-10-batches-py/``): ``data_batch_1`` …
``data_batch_5`` (10,000 images each), ``test_batch`` (10,000) and ``batches.meta``
(``b"label_names"``). CIFAR-100 (``cifar-100-python.tar.gz`` → ``cifar-100-python/``):
``train`` (50,000), ``test`` (10,000) and ``meta`` (``b"fine_label_names"``). Each batch is a
py2 pickle of a dict whose ``b"data"`` is ``(N, 3072)`` uint8, every row the R, G and B planes
of a 32×32 image (row-major), and whose ``b"labels"`` (CIFAR-100: ``b"fine_labels"``) are the
class ids. Every file goes through :func:`~kattn.data.safe_pickle.load_pickle`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import DataFormatError
from .safe_pickle import load_pickle

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
CIFAR100_FILES = ("train", "test", "meta")
#: the pixels of one 32×32 image.
PIXELS = 32 * 32
ROW_LENGTH = 3 * PIXELS

Pixels = npt.NDArray[np.uint8]
Labels = npt.NDArray[np.int64]


@dataclass
class CifarArrays:
    """A CIFAR release as read: rows ``(N, 3072)`` uint8 and labels of train and test."""

    folder: Path
    train: Pixels
    train_labels: Labels
    test: Pixels
    test_labels: Labels
    classes: list[str]


def cifar10_folder(data_dir: Path) -> Path | None:
    """``data_dir`` or its ``cifar-10-batches-py/`` if it holds CIFAR-10 batches, else None."""
    for folder in (data_dir, data_dir / "cifar-10-batches-py"):
        if (folder / TEST_FILE).is_file() or (folder / TRAIN_FILES[0]).is_file():
            return folder
    return None


def find_cifar10(data_dir: Path) -> Path:
    """The folder of CIFAR-10's batches (``data_dir`` or its ``cifar-10-batches-py/``).

    Raises:
        DataFormatError: neither holds ``data_batch_1`` or ``test_batch``.
    """
    folder = cifar10_folder(data_dir)
    if folder is None:
        looked = f"{data_dir} and {data_dir / 'cifar-10-batches-py'}"
        raise DataFormatError(
            f"no CIFAR-10 batches found: looked for {TRAIN_FILES[0]} and {TEST_FILE} in "
            f"{looked}; expected the unpacked cifar-10-python.tar.gz (cifar-10-batches-py/)"
        )
    return folder


def cifar100_folder(data_dir: Path) -> Path | None:
    """``data_dir`` or its ``cifar-100-python/`` if it holds CIFAR-100's ``train`` and
    ``meta``, else None."""
    for folder in (data_dir, data_dir / "cifar-100-python"):
        if (folder / "train").is_file() and (folder / "meta").is_file():
            return folder
    return None


def read_cifar_batch(
    path: Path, *, label_key: bytes = b"labels", num_classes: int = 10, what: str = "CIFAR-10"
) -> tuple[Pixels, Labels]:
    """The rows ``(N, 3072)`` uint8 and labels ``(N,)`` int64 of one python batch.

    Raises:
        DataFormatError: the file is missing or unreadable, is not a dict with ``b"data"``
            ``(N, 3072)`` uint8 and ``N`` integer ``label_key`` in ``[0, num_classes)``
            (the message names the file).
    """
    keys = f"b'data' and {label_key!r}"
    batch = load_pickle(path, what=f"{what} batch", expected=f"a pickled dict with {keys}")
    if not isinstance(batch, dict) or not {b"data", label_key} <= batch.keys():
        got = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise DataFormatError(f"{path}: expected a dict with keys {keys}, got {got}")
    data, labels = batch[b"data"], batch[label_key]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2) or (
        data.shape[1] != ROW_LENGTH
    ):
        raise DataFormatError(
            f"{path}: b'data' must be a (N, {ROW_LENGTH}) uint8 array, got "
            f"{type(data).__name__} of shape {getattr(data, 'shape', None)} and dtype "
            f"{getattr(data, 'dtype', None)}"
        )
    return data, check_labels(path, labels, data.shape[0], num_classes, key=repr(label_key))


def check_labels(
    path: Path, labels: Any, n: int, num_classes: int, *, key: str, first: int = 0
) -> Labels:
    """``labels`` as ``(n,)`` int64, checked to be integers in ``[first, first + num_classes)``.

    Raises:
        DataFormatError: naming ``path`` and ``key``.
    """
    try:
        array = np.asarray(labels)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"dtype {array.dtype}")
        array = array.astype(np.int64)
    except (TypeError, ValueError) as err:
        raise DataFormatError(f"{path}: {key} are not integers ({err})") from None
    if array.shape != (n,):
        raise DataFormatError(f"{path}: {array.size} {key} for {n} images, expected one each")
    if array.size and not first <= array.min() <= array.max() < first + num_classes:
        raise DataFormatError(
            f"{path}: {key} must be in {first}-{first + num_classes - 1}, got "
            f"{array.min()}..{array.max()}"
        )
    return array


def read_label_names(path: Path, key: bytes, count: int, *, what: str) -> list[str]:
    """The ``count`` class names stored under ``key`` in a meta pickle.

    Raises:
        DataFormatError: the file is missing or unreadable, or ``key`` is not a list of
            ``count`` names.
    """
    meta = load_pickle(path, what=f"{what} meta file", expected=f"a dict with {key!r}")
    names = meta.get(key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != count:
        got = f"{len(names)} entries" if isinstance(names, list) else type(names).__name__
        raise DataFormatError(f"{path}: {key!r} must list the {count} class names, got {got}")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def read_cifar10(folder: Path) -> CifarArrays:
    """CIFAR-10's train (``data_batch_1`` … ``_5`` in order), test and class names."""
    train = [read_cifar_batch(folder / name) for name in TRAIN_FILES]
    test, test_labels = read_cifar_batch(folder / TEST_FILE)
    classes = read_label_names(folder / META_FILE, b"label_names", 10, what="CIFAR-10")
    return CifarArrays(
        folder,
        np.concatenate([data for data, _ in train]),
        np.concatenate([labels for _, labels in train]),
        test,
        test_labels,
        classes,
    )


def read_cifar100(folder: Path) -> CifarArrays:
    """CIFAR-100's train, test (fine labels, 100 classes) and class names."""
    kwargs: dict[str, Any] = {"label_key": b"fine_labels", "num_classes": 100, "what": "CIFAR-100"}
    train, train_labels = read_cifar_batch(folder / "train", **kwargs)
    test, test_labels = read_cifar_batch(folder / "test", **kwargs)
    classes = read_label_names(folder / "meta", b"fine_label_names", 100, what="CIFAR-100")
    return CifarArrays(folder, train, train_labels, test, test_labels, classes)


def write_cifar10(
    folder: Path,
    train: Pixels,
    train_labels: Labels,
    test: Pixels,
    test_labels: Labels,
    classes: list[str],
) -> None:
    """Write rows ``(N, 3072)`` uint8 in CIFAR-10's python layout: train in five equal
    ``data_batch_*`` files, ``test_batch`` and ``batches.meta``: dicts with bytes keys, as the
    release's py2 pickles load under ``encoding="bytes"``, so that :func:`read_cifar10` and
    the usual CIFAR loaders read them. Protocol 4 stores the pixels as raw bytes (protocol 2
    would write them as a latin-1 string, half as large again)."""
    if len(train) % len(TRAIN_FILES):
        raise ValueError(f"{len(train)} train images do not split into {len(TRAIN_FILES)} batches")
    folder.mkdir(parents=True, exist_ok=True)
    per_batch = len(train) // len(TRAIN_FILES)
    for i, name in enumerate(TRAIN_FILES):
        rows = slice(i * per_batch, (i + 1) * per_batch)
        label = f"training batch {i + 1} of {len(TRAIN_FILES)}"
        _dump(folder / name, _batch(label, train[rows], train_labels[rows]))
    _dump(folder / TEST_FILE, _batch("testing batch 1 of 1", test, test_labels))
    meta = {
        b"num_cases_per_batch": per_batch,
        b"label_names": [name.encode() for name in classes],
        b"num_vis": ROW_LENGTH,
    }
    _dump(folder / META_FILE, meta)


def _batch(label: str, data: Pixels, labels: Labels) -> dict[bytes, Any]:
    return {
        b"batch_label": label.encode(),
        b"labels": [int(k) for k in labels],
        b"data": np.ascontiguousarray(data, dtype=np.uint8),
        b"filenames": [f"image_{i:05d}.png".encode() for i in range(len(labels))],
    }


def _dump(path: Path, obj: Any) -> None:
    with path.open("wb") as file:
        pickle.dump(obj, file, protocol=4)
