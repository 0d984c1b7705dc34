"""An ImageNet-style folder: ``train/<class>/*.JPEG`` and ``val/<class>/…``, decoded lazily.

Classes are the sorted names of ``train``'s subfolders (as torchvision's ``ImageFolder``);
images are the files ending in ``.jpeg``, ``.jpg`` or ``.png`` (any case), sorted by name.

Splits: test is ``test`` when it has class folders, else ``val`` (ImageNet's 50,000 labelled
validation images, on which papers report, Luo et al. 2021 §4.4 included); ``val`` is not read
when ``test`` is there. Valid, on which a run picks its checkpoint, is never the test images:
it is a seeded random hold-out of train, a tenth of it and at most 10,000 images
(:func:`~kattn.data.images_splits.holdout_rows`, the rule of downsampled ImageNet), and train
is the rest, both in file order. ``source`` records both choices.

Every image is decoded with Pillow when asked for, converted to RGB, resized (bicubic) so that
its shorter side is ``int(image_size / 0.875)`` and centre-cropped to
``image_size × image_size``: DeiT's evaluation transform (Touvron et al. 2021, whose
``int(input_size / 0.875)`` gives 256 at 224 and 36, not 37, at 32). Pillow is the optional
dependency of the ``vision`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import DataFormatError
from .images_splits import (
    ImageData,
    ImageSplit,
    holdout_note,
    holdout_rows,
    holdout_size,
    split_sizes,
)

EXTENSIONS = (".jpeg", ".jpg", ".png")
#: DeiT's ratio of the crop to the shorter side it is cut from (224 / 256).
CROP_RATIO = 0.875


def is_image_folder(data_dir: Path) -> bool:
    """Whether ``data_dir/train`` has a subfolder (a class)."""
    train = data_dir / "train"
    return train.is_dir() and any(p.is_dir() for p in train.iterdir())


class FolderImageSplit(ImageSplit):
    """Image files and their labels; :meth:`images` decodes, resizes and crops them.

    Args:
        paths: one file per image.
        labels: ``(N,)`` class ids.
        image_size: the side of every image handed out.
    """

    def __init__(self, paths: list[Path], labels: Tensor, image_size: int) -> None:
        if len(paths) != labels.shape[0]:
            raise ValueError(f"{len(paths)} paths for {labels.shape[0]} labels")
        self.paths = paths
        self.labels = labels.to(torch.int64)
        self.image_size = image_size

    def images(self, index: Tensor) -> Tensor:
        rows = self._rows(index).tolist()
        out = torch.empty(len(rows), 3, self.image_size, self.image_size, dtype=torch.uint8)
        for k, row in enumerate(rows):
            out[k] = decode_image(self.paths[row], self.image_size)
        return out


def resize_side(image_size: int) -> int:
    """The shorter side an image is resized to before the centre crop: DeiT's
    ``int(image_size / 0.875)`` (truncated, as DeiT's ``int((256 / 224) * input_size)``)."""
    return int(image_size / CROP_RATIO)


def decode_image(path: Path, image_size: int) -> Tensor:
    """One file as ``(3, image_size, image_size)`` uint8: RGB, shorter side resized (bicubic)
    to :func:`resize_side`, centre crop (torchvision's ``Resize`` and ``CenterCrop``
    arithmetic).

    Raises:
        DataFormatError: Pillow cannot read the file (truncated, not an image, a
            decompression bomb): whatever Pillow raises, with the file's name.
        ImportError: Pillow is not installed.
    """
    image_module = _pil()
    short = resize_side(image_size)
    try:
        with image_module.open(path) as opened:
            image = opened.convert("RGB")
    except Exception as err:  # Pillow's plugins raise many kinds on a damaged file: OSError,
        # SyntaxError, ValueError, struct.error, Image.DecompressionBombError, ...
        raise DataFormatError(
            f"{path} is not a readable image ({type(err).__name__}: {err})"
        ) from err
    width, height = image.size
    if width <= height:
        new = (short, int(short * height / width))
    else:
        new = (int(short * width / height), short)
    image = image.resize(new, image_module.Resampling.BICUBIC)
    left = round((new[0] - image_size) / 2.0)  # torchvision's CenterCrop, ties to even
    top = round((new[1] - image_size) / 2.0)
    image = image.crop((left, top, left + image_size, top + image_size))
    pixels = np.asarray(image, dtype=np.uint8)  # (H, W, 3)
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


def load_image_folder(data_dir: Path, *, image_size: int | None, seed: int = 0) -> ImageData:
    """The folder as :class:`ImageData` (see the module docstring for the splits).

    Args:
        data_dir: the folder holding ``train/`` and ``test/`` or ``val/``.
        image_size: the side of the images handed out.
        seed: the seed of valid's hold-out from train.

    Raises:
        ValueError: ``image_size`` is None.
        DataFormatError: a class folder of ``train`` holds no image, train has too few images
            to hold some out, neither ``test`` nor ``val`` has class folders, or the test
            folder has a class that ``train`` lacks.
    """
    if image_size is None:
        raise ValueError(
            f"{data_dir} is an ImageNet-style folder of images of any size: pass image_size "
            f"(e.g. 224), the side they are resized and centre-cropped to"
        )
    _pil()
    train_dir = data_dir / "train"
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    paths, labels = _scan(train_dir, classes, every_class=True)
    n = len(paths)
    if holdout_size(n) >= n:
        raise DataFormatError(
            f"{train_dir} holds {n} image(s): valid holds out {holdout_size(n)} of train, "
            "which leaves no training image"
        )
    train_rows, valid_rows = holdout_rows(n, seed)
    train = FolderImageSplit(
        [paths[i] for i in train_rows.tolist()], labels[train_rows], image_size
    )
    valid = FolderImageSplit(
        [paths[i] for i in valid_rows.tolist()], labels[valid_rows], image_size
    )
    test_dir, val_dir = data_dir / "test", data_dir / "val"
    has_test = test_dir.is_dir() and any(p.is_dir() for p in test_dir.iterdir())
    if not has_test and not val_dir.is_dir():
        raise DataFormatError(
            f"{data_dir} has neither test/ nor val/: expected test/<class>/ or val/<class>/ "
            f"(the test split) beside {train_dir}"
        )
    test = FolderImageSplit(
        *_scan(test_dir if has_test else val_dir, classes, every_class=False), image_size
    )
    source: dict[str, Any] = {
        "format": "image-folder",
        "path": str(data_dir),
        "sizes": split_sizes(train, valid, test),
        "resize": f"shorter side to {resize_side(image_size)} = int({image_size} / "
        f"{CROP_RATIO}) (bicubic, Pillow), centre crop {image_size}x{image_size}, RGB",
        "valid": holdout_note(n, seed),
        "test": "test/" if has_test else "val/ (the folder has no test/ with class folders)",
    }
    return ImageData(
        train,
        valid,
        test,
        num_classes=len(classes),
        classes=classes,
        channels=3,
        size=(image_size, image_size),
        source=source,
    )


def _scan(folder: Path, classes: list[str], *, every_class: bool) -> tuple[list[Path], Tensor]:
    """The image files of ``folder``'s class folders and their ``(N,)`` labels."""
    known = {name: k for k, name in enumerate(classes)}
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
    if not subfolders:
        raise DataFormatError(
            f"{folder} has no class folders: expected {folder.name}/<class>/*.JPEG as in train/"
        )
    paths: list[Path] = []
    labels: list[int] = []
    for sub in subfolders:
        if sub.name not in known:
            raise DataFormatError(
                f"{sub}: class {sub.name!r} is not among the {len(classes)} classes of train/"
            )
        files = sorted(p for p in sub.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())
        if not files and every_class:
            raise DataFormatError(f"{sub} holds no image (files ending in {', '.join(EXTENSIONS)})")
        paths.extend(files)
        labels.extend([known[sub.name]] * len(files))
    if not paths:
        raise DataFormatError(f"{folder} holds no image in its class folders")
    return paths, torch.tensor(labels, dtype=torch.int64)


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "ImageNet-style folders are decoded with Pillow: pip install 'kattn[vision]'"
        ) from err
    return Image
