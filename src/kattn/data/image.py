"""LRA Image: CIFAR-10 in greyscale, classified from its 1024 pixel intensities.

LRA loads TFDS ``cifar10`` (``train[:90%]`` / ``train[90%:]`` / ``test``: 45,000 / 5,000 /
10,000), applies ``tf.image.rgb_to_grayscale`` to the uint8 images, casts to int and flattens
each 32×32 image row-major to 1024 tokens: vocabulary 256, 10 classes (implementation notes
§D.1–D.2). kattn reads the python version of the release (``cifar-10-python.tar.gz``, unpacked
to ``cifar-10-batches-py/``), whose batches :mod:`kattn.data.images_cifar` reads through the
restricted unpickler of :mod:`kattn.data.safe_pickle`.

Token ids are pixel values, so id 0 is a black pixel, not padding: every image has length 1024,
and LRA's ``pad_id_mask=True`` convention (see :mod:`kattn.data.base`) masks black pixels.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .base import DataFormatError, TaskData, pixel_dataset
from .images_cifar import PIXELS as _PIXELS
from .images_cifar import TEST_FILE, TRAIN_FILES, find_cifar10, read_cifar_batch

#: ``tf.image.rgb_to_grayscale``'s weights of R, G and B.
GRAYSCALE_WEIGHTS = (0.2989, 0.5870, 0.1140)

_CLASSES = 10


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
    folder = find_cifar10(Path(data_dir))
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


def _read_batches(paths: list[Path]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    pixels, labels = [], []
    for path in paths:
        data, batch_labels = read_cifar_batch(path)
        pixels.append(rgb_to_grayscale(data))
        labels.append(batch_labels)
    return np.concatenate(pixels), np.concatenate(labels)
