"""Image classification data in its released formats, and the embedded set.

:func:`load_images` recognises the layout of a folder and returns :class:`ImageData`: three
:class:`ImageSplit` s handing out ``(n, C, H, W)`` uint8 images, the class names, and a
``source`` record for ``results.json``. Formats (one module each):

* CIFAR-10 and CIFAR-100, python release (:mod:`kattn.data.images_cifar`): valid is the last
  10% of train (as LRA's ``train[90%:]``), test the test batch.
* Downsampled ImageNet 16/32/64 (:mod:`kattn.data.images_downsampled`): valid is a seeded
  hold-out of 10,000 train images, test is ``val_data``.
* An ImageNet-style folder (:mod:`kattn.data.images_folder`): ``train/<class>/`` and
  ``test/<class>/`` or ``val/<class>/`` (the test split), decoded lazily with Pillow; valid is
  a seeded hold-out of train as for downsampled ImageNet.
* ``path=None``: the embedded set of ten shapes (:mod:`kattn.data.image_embedded`), written
  once in CIFAR-10's layout and read back through the CIFAR-10 reader.

For the in-memory formats ``image_size`` resizes every image on the way out
(:func:`~kattn.data.images_splits.resize_images`: antialiased bilinear in torch); the stored
tensor keeps the released size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..checks import positive_int_or_none
from .base import DataFormatError
from .image_embedded import embedded_images, embedded_source
from .images_cifar import CifarArrays, cifar10_folder, cifar100_folder, read_cifar10, read_cifar100
from .images_downsampled import find_downsampled, load_downsampled
from .images_folder import is_image_folder, load_image_folder
from .images_splits import (
    ImageData,
    ImageSplit,
    TensorImageSplit,
    resize_images,
    split_sizes,
)

__all__ = [
    "FORMATS",
    "ImageData",
    "ImageSplit",
    "TensorImageSplit",
    "embedded_images",
    "load_images",
    "resize_images",
]

#: the layouts :func:`load_images` recognises, as its error message lists them.
FORMATS = {
    "cifar10-python": "CIFAR-10 python batches (cifar-10-batches-py/: data_batch_1..5, "
    "test_batch, batches.meta)",
    "cifar100-python": "CIFAR-100 python (cifar-100-python/: train, test, meta)",
    "downsampled-imagenet": "downsampled ImageNet 16/32/64 (train_data_batch_1..10 and "
    "val_data, .npz or pickles, in the folder or its subfolders)",
    "image-folder": "an ImageNet-style folder (train/<class>/*.JPEG|jpg|png, and test/<class>/ "
    "or val/<class>/)",
}
#: the part of train that CIFAR's valid split takes, from its end.
VALID_FRACTION = 0.1


def load_images(
    path: str | Path | None, *, image_size: int | None = None, seed: int = 0
) -> ImageData:
    """Load an image-classification data set from its released files, or the embedded set.

    Args:
        path: the folder of a release (see :data:`FORMATS`), or None for the embedded set of
            ten shapes (generated under ``$KATTN_CACHE`` on first use).
        image_size: the side of the square images handed out. Required for image folders
            (resize and centre crop); for the in-memory formats a resize (antialiased
            bilinear), None keeping the released size.
        seed: the seed of the valid hold-out from train of downsampled ImageNet and image
            folders (CIFAR and the embedded set ignore it: their splits are fixed).

    Returns:
        The splits, classes, channels, size and ``source`` (format, path, sizes, resize, how
        valid and test were made; for the embedded set its generator, parameters, version and
        file hashes).

    Raises:
        ValueError: ``path`` is not a folder or holds none of :data:`FORMATS` (the message
            lists them), or ``image_size`` is not a positive int (or missing for a folder).
        DataFormatError: a file of the release is missing, truncated or malformed (the
            message names it).
        ImportError: an image folder needs Pillow (``pip install 'kattn[vision]'``).
    """
    positive_int_or_none("image_size", image_size)
    if path is None:
        embedded = embedded_images()
        data = _cifar_data(read_cifar10(embedded), "embedded-shapes (cifar10-python)", image_size)
        data.source.update(embedded_source(embedded))
        return data
    data_dir = Path(path)
    if not data_dir.is_dir():
        raise ValueError(f"image data path {data_dir} is not a folder")
    cifar10 = cifar10_folder(data_dir)
    if cifar10 is not None:
        return _cifar_data(read_cifar10(cifar10), "cifar10-python", image_size)
    cifar100 = cifar100_folder(data_dir)
    if cifar100 is not None:
        return _cifar_data(read_cifar100(cifar100), "cifar100-python", image_size)
    files = find_downsampled(data_dir)
    if files is not None:
        return load_downsampled(files, data_dir, image_size=image_size, seed=seed)
    if is_image_folder(data_dir):
        return load_image_folder(data_dir, image_size=image_size, seed=seed)
    known = "; ".join(FORMATS.values())
    raise ValueError(f"{data_dir} holds no image data set kattn knows; the formats are: {known}")


def _cifar_data(arrays: CifarArrays, fmt: str, image_size: int | None) -> ImageData:
    """Train split into train and valid (its last :data:`VALID_FRACTION`), test as is."""
    n = len(arrays.train_labels)
    cut = round(n * (1 - VALID_FRACTION))  # TFDS rounds percent boundaries to the closest
    if cut in (0, n) or len(arrays.test_labels) == 0:
        raise DataFormatError(
            f"{arrays.folder}: {n} train and {len(arrays.test_labels)} test images leave a "
            f"split empty (valid is the last {VALID_FRACTION:.0%} of train)"
        )
    train = torch.from_numpy(arrays.train).view(n, 3, 32, 32)
    labels = torch.from_numpy(arrays.train_labels)
    test = torch.from_numpy(arrays.test).view(-1, 3, 32, 32)
    splits: tuple[ImageSplit, ImageSplit, ImageSplit] = (
        TensorImageSplit(train, labels, rows=torch.arange(cut), size=image_size),
        TensorImageSplit(train, labels, rows=torch.arange(cut, n), size=image_size),
        TensorImageSplit(test, torch.from_numpy(arrays.test_labels), size=image_size),
    )
    size = image_size or 32
    source: dict[str, Any] = {
        "format": fmt,
        "path": str(arrays.folder),
        "sizes": split_sizes(*splits),
        "stored_size": [32, 32],
        "resize": None if size == 32 else f"32x32 -> {size}x{size}, antialiased bilinear (torch)",
        "valid": f"the last {n - cut} of {n} train images (train[{cut}:])",
        "test": "test" if fmt == "cifar100-python" else "test_batch",
    }
    return ImageData(
        *splits,
        num_classes=len(arrays.classes),
        classes=arrays.classes,
        channels=3,
        size=(size, size),
        source=source,
    )
