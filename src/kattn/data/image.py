"""LRA Image: CIFAR-10 in greyscale, classified from its 1024 pixel intensities.

LRA loads TFDS ``cifar10`` (``train[:90%]`` / ``train[90%:]`` / ``test``: 45,000 / 5,000 /
10,000), applies ``tf.image.rgb_to_grayscale`` to the uint8 images, casts to int and flattens
each 32×32 image row-major to 1024 tokens: vocabulary 256, 10 classes (implementation notes
§D.1–D.2). kattn reads the python version of the release (``cifar-10-python.tar.gz``, unpacked
to ``cifar-10-batches-py/``).

Token ids are pixel values, so id 0 is a black pixel, not padding: every image has length 1024,
and LRA's ``pad_id_mask=True`` convention (see :mod:`kattn.data.base`) masks black pixels.
"""

from __future__ import annotations

import pickle
from os import PathLike
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from .base import DataFormatError, TaskData, pixel_dataset

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"

#: ``tf.image.rgb_to_grayscale``'s weights of R, G and B.
GRAYSCALE_WEIGHTS = (0.2989, 0.5870, 0.1140)

_PIXELS = 32 * 32
_CLASSES = 10

#: what an unpickled batch may reference: numpy arrays (as written by numpy 1 and 2, pickle
#: protocols 2–5), numpy scalars and the bytes codec of protocol 2. Nothing else is imported,
#: so a tampered file cannot run code.
_PICKLE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


def rgb_to_grayscale(data: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Greyscale of CIFAR rows, as ``tf.image.rgb_to_grayscale`` computes it on uint8 images.

    ``y = ⌊255.5 · (0.2989·r + 0.5870·g + 0.1140·b)⌋`` with ``r = R · float32(1/255)`` etc.,
    all in float32. TF's ``convert_image_dtype`` goes to float by multiplying by ``1/255`` and
    back by multiplying by ``255 + 0.5`` and casting (truncation): that is not round-half-up of
    ``255 · gray`` (``(200, 0, 0)`` gives 59, rounding would give 60). TF sums the three
    products in a float32 matmul; its order of summation may differ from this one in the last
    bit, which changes a result only where ``255.5 · gray`` lies within float32 rounding of an
    integer.

    Args:
        data: ``(N, 3072)`` uint8, each row the R, G and B planes of 1024 row-major pixels.

    Returns:
        ``(N, 1024)`` uint8 intensities, row-major.
    """
    n = data.shape[0]
    planes = data.reshape(n, 3, _PIXELS).astype(np.float32) * np.float32(1.0 / 255)
    w = np.asarray(GRAYSCALE_WEIGHTS, dtype=np.float32)
    gray = planes[:, 0] * w[0] + planes[:, 1] * w[1] + planes[:, 2] * w[2]  # (N, 1024) float32
    return (gray * np.float32(255.5)).astype(np.uint8)


def load_image(data_dir: str | PathLike[str], *, valid_fraction: float = 0.1) -> TaskData:
    """Load LRA Image (greyscale CIFAR-10) from the python pickle batches.

    Train is ``data_batch_1`` … ``data_batch_5`` in order; validation is its last
    ``valid_fraction`` (``train[90%:]`` as a TFDS split string counts it: 5,000 of 50,000), and
    test is ``test_batch``. TFDS stores its examples in a fixed shuffled order, so its
    ``train[90%:]`` holds other images than the last 5,000 here; the sizes are LRA's.

    Args:
        data_dir: ``cifar-10-batches-py`` or the folder holding it.
        valid_fraction: the part of train, taken from its end, used for validation.

    Returns:
        Tokens ``(N, 1024)``: pixel intensities 0–255 (0 is a black pixel, which LRA's
        ``pad_id_mask=True`` masks), lengths all 1024, vocabulary 256, 10 classes.

    Raises:
        DataFormatError: the folder or a batch file is missing, a batch is not a dict with
            ``b"data"`` ``(N, 3072)`` uint8 and ``N`` ``b"labels"`` in 0–9, or a split would
            be empty (the message names the split and the file).
        ValueError: ``valid_fraction`` is not in (0, 1).
    """
    if isinstance(valid_fraction, bool) or not 0 < valid_fraction < 1:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction!r}")
    folder = _find_folder(Path(data_dir))
    train_pixels, train_labels = _read_batches([folder / name for name in TRAIN_FILES])
    test_pixels, test_labels = _read_batches([folder / TEST_FILE])
    n = len(train_labels)
    cut = round(n * (1 - valid_fraction))  # TFDS rounds percent boundaries to the closest
    _check_not_empty(folder, n, cut, len(test_labels), valid_fraction)
    return TaskData(
        task="image",
        train=pixel_dataset(train_pixels[:cut], train_labels[:cut]),
        valid=pixel_dataset(train_pixels[cut:], train_labels[cut:]),
        test=pixel_dataset(test_pixels, test_labels),
        vocab_size=256,
        num_classes=_CLASSES,
        max_len=_PIXELS,
        info={
            "source": str(folder),
            "tokenisation": "tf.image.rgb_to_grayscale intensities 0-255, row-major; "
            "0 is a black pixel",
            "valid": f"the last {n - cut} of {n} train images (train[{cut}:])",
        },
    )


def _check_not_empty(folder: Path, n: int, cut: int, n_test: int, valid_fraction: float) -> None:
    batches = f"{folder / TRAIN_FILES[0]} to {TRAIN_FILES[-1]}"
    if n == 0:
        raise DataFormatError(f"the train split is empty: {batches} hold no images")
    if cut == n:
        raise DataFormatError(
            f"the valid split is empty: the last {valid_fraction:.0%} of {n} train images "
            f"({batches}) rounds to none; expected the 50,000 images of CIFAR-10"
        )
    if n_test == 0:
        raise DataFormatError(f"the test split is empty: {folder / TEST_FILE} holds no images")


def _find_folder(data_dir: Path) -> Path:
    candidates = (data_dir, data_dir / "cifar-10-batches-py")
    for folder in candidates:
        if (folder / TEST_FILE).is_file() or (folder / TRAIN_FILES[0]).is_file():
            return folder
    looked = " and ".join(str(c) for c in candidates)
    raise DataFormatError(
        f"no CIFAR-10 batches found: looked for {TRAIN_FILES[0]} and {TEST_FILE} in {looked}; "
        f"expected the unpacked cifar-10-python.tar.gz (cifar-10-batches-py/)"
    )


def _read_batches(paths: list[Path]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    pixels, labels = [], []
    for path in paths:
        data, batch_labels = _read_batch(path)
        pixels.append(rgb_to_grayscale(data))
        labels.append(batch_labels)
    return np.concatenate(pixels), np.concatenate(labels)


def _read_batch(path: Path) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    if not path.is_file():
        raise DataFormatError(
            f"{path} is missing: expected the CIFAR-10 python batch (a pickled dict with "
            f"b'data' and b'labels')"
        )
    with path.open("rb") as file:
        try:
            batch = _BatchUnpickler(file).load()
        except Exception as err:  # a truncated or foreign file can fail in many ways
            raise DataFormatError(f"{path} is not a readable CIFAR-10 batch: {err}") from None
    if not isinstance(batch, dict) or not {b"data", b"labels"} <= batch.keys():
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise DataFormatError(
            f"{path}: expected a dict with keys b'data' and b'labels', got {keys}"
        )
    data, labels = batch[b"data"], batch[b"labels"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2) or (
        data.shape[1] != 3 * _PIXELS
    ):
        shape = getattr(data, "shape", None)
        raise DataFormatError(
            f"{path}: b'data' must be a (N, 3072) uint8 array, got "
            f"{type(data).__name__} of shape {shape} and dtype {getattr(data, 'dtype', None)}"
        )
    try:
        labels_arr = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as err:
        raise DataFormatError(f"{path}: b'labels' are not integers ({err})") from None
    if labels_arr.shape != (data.shape[0],):
        raise DataFormatError(
            f"{path}: {labels_arr.size} b'labels' for {data.shape[0]} images, expected one each"
        )
    if labels_arr.size and not 0 <= labels_arr.min() <= labels_arr.max() < _CLASSES:
        raise DataFormatError(f"{path}: b'labels' must be in 0-9")
    return data, labels_arr


class _BatchUnpickler(pickle.Unpickler):
    """Reads the py2 pickles of the release (``encoding="bytes"``), importing only numpy's
    array reconstructors."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__(file, encoding="bytes")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS:
            raise DataFormatError(
                f"refusing to load {module}.{name}: a CIFAR-10 batch holds only numpy arrays "
                f"and lists"
            )
        return super().find_class(module, name)
