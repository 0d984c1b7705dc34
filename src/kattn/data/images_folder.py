"""An ImageNet-style folder: ``train/<class>/*.JPEG`` and ``val/<class>/…``, decoded lazily.

Classes are the sorted names of ``train``'s subfolders (as torchvision's ``ImageFolder``);
images are the files ending in ``.jpeg``, ``.jpg`` or ``.png`` (any case), sorted by name.
Valid is ``val``; test is ``test`` when it has class folders, else ``val`` again (``source``
says which). Every image is decoded with Pillow when asked for, converted to RGB, resized
(bicubic) so that its shorter side is ``round(image_size / 0.875)`` and centre-cropped to
``image_size × image_size``: DeiT's evaluation transform (Touvron et al. 2021, 256 → 224 at
224). Pillow is the optional dependency of the ``vision`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import DataFormatError
from .images_splits import ImageData, ImageSplit, split_sizes

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


def decode_image(path: Path, image_size: int) -> Tensor:
    """One file as ``(3, image_size, image_size)`` uint8: RGB, shorter side resized (bicubic)
    to ``round(image_size / 0.875)``, centre crop (torchvision's ``Resize`` and
    ``CenterCrop`` arithmetic).

    Raises:
        DataFormatError: Pillow cannot read the file (truncated, not an image).
        ImportError: Pillow is not installed.
    """
    image_module = _pil()
    short = round(image_size / CROP_RATIO)
    try:
        with image_module.open(path) as opened:
            image = opened.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:  # PIL's errors for broken files
        raise DataFormatError(f"{path} is not a readable image: {err}") from None
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


def load_image_folder(data_dir: Path, *, image_size: int | None) -> ImageData:
    """The folder as :class:`ImageData` (see the module docstring).

    Raises:
        ValueError: ``image_size`` is None.
        DataFormatError: a class folder of ``train`` holds no image, ``val`` has no class
            folders or one that ``train`` lacks.
    """
    if image_size is None:
        raise ValueError(
            f"{data_dir} is an ImageNet-style folder of images of any size: pass image_size "
            f"(e.g. 224), the side they are resized and centre-cropped to"
        )
    _pil()
    train_dir = data_dir / "train"
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    train = _scan(train_dir, classes, image_size, every_class=True)
    val_dir = data_dir / "val"
    if not val_dir.is_dir():
        raise DataFormatError(f"{val_dir} is missing: expected val/<class>/ beside {train_dir}")
    valid = _scan(val_dir, classes, image_size, every_class=False)
    test_dir = data_dir / "test"
    has_test = test_dir.is_dir() and any(p.is_dir() for p in test_dir.iterdir())
    test = _scan(test_dir, classes, image_size, every_class=False) if has_test else valid
    source: dict[str, Any] = {
        "format": "image-folder",
        "path": str(data_dir),
        "sizes": split_sizes(train, valid, test),
        "resize": f"shorter side to {round(image_size / CROP_RATIO)} (bicubic, Pillow), "
        f"centre crop {image_size}x{image_size}, RGB",
        "valid": "val/",
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


def _scan(folder: Path, classes: list[str], image_size: int, *, every_class: bool) -> ImageSplit:
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
    return FolderImageSplit(paths, torch.tensor(labels, dtype=torch.int64), image_size)


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "ImageNet-style folders are decoded with Pillow: pip install 'kattn[vision]'"
        ) from err
    return Image
