"""What the image tasks share: classification with a Vision Transformer
(:mod:`kattn.train.image_classification`; Luo et al. 2021, §4.4 and Appendix A.4, after DeiT:
Touvron et al. 2021) and pixel-level generation (:mod:`kattn.train.image_generation`; Luo et
al. 2021, Appendix A.5).

Both read :class:`~kattn.data.ImageData` (:func:`kattn.data.load_images`: CIFAR-10/100, an
ImageNet-style folder, downsampled ImageNet, or the embedded generated shapes). Relative
positions are those of the image: a mechanism whose encoding is the 1-D Toeplitz one
(``nprf_rpe``'s default) gets the 2-D one (``toeplitz2d``) on the patch grid (classification)
or the (row, sub-pixel column) grid (generation); ``results.json`` records the options used.

Summed statistics are ``[loss_sum, correct, count]`` as for the other tasks (count: images,
or sub-pixels for generation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..data import ImageData, load_images
from ..registry import spec
from .config import RunConfig
from .field_checks import (
    IMAGE_TASK_MODEL_FIELDS,
    refuse_image_fields,
    refuse_translation_fields,
    refuse_unread_data_fields,
    refuse_unread_model_fields,
)
from .objective_base import SPLITS, Objective, shuffled_index

#: the data fields the image tasks refuse (they are the LRA and lm tasks').
_SEQUENCE_FIELDS = ("max_len", "truncate", "block_size", "tokenizer")


def image_attention_options(config: RunConfig) -> dict[str, Any]:
    """The mechanism's options for an image model: when the mechanism's default encoding is
    the 1-D Toeplitz one (``nprf_rpe``'s) and no ``rpe`` is given, ``"toeplitz2d"``, whose
    grid the model sets; a given ``rpe`` is kept (``rpe="toeplitz"``: 1-D over the raster
    order; ``rpe=None``: no relative positions)."""
    options = dict(config.attention.options)
    if "rpe" not in options and spec(config.attention.name).defaults.get("rpe") == "toeplitz":
        options["rpe"] = "toeplitz2d"
    return options


def check_image_fields(config: RunConfig, allow: tuple[str, ...]) -> None:
    """Refuse the fields of the other tasks; ``allow``: the image and smoothing fields the
    task reads (dotted)."""
    refuse_unread_data_fields(config, _SEQUENCE_FIELDS)
    refuse_translation_fields(config, allow=allow)
    refuse_image_fields(config, allow=allow)
    refuse_unread_model_fields(config, IMAGE_TASK_MODEL_FIELDS[config.data.task])
    size = config.data.image_size
    if size is not None and size < 1:
        raise ValueError(f"data.image_size must be a positive number of pixels, got {size}")


class ImageTask(Objective[ImageData]):
    """What both image tasks share: the data, its splits and the batches of images."""

    embedded_data = "the embedded generated shapes (32×32 RGB, 10 classes)"
    unit = "images"

    def __init__(self, config: RunConfig, data: ImageData) -> None:
        super().__init__(config, data)
        for split in SPLITS:
            if not len(getattr(data, split)):
                raise ValueError(
                    f"the {split} split of the images from {data.source.get('path', 'memory')} "
                    "is empty: a run trains, validates and tests on images of each split"
                )

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> ImageData:
        return load_images(config.data.path, image_size=config.data.image_size)

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, None]:
        """The model, sized by the run's images (read again: folders lazily)."""
        return cls(config, cls.load_data(config)).build_model(config), None

    def size(self, split: str) -> int:
        return len(getattr(self.data, split))

    def eval_index(self, split: str, limit: int | None, seed: int) -> Tensor:
        """Every image in order, or the first ``limit`` of a fixed shuffled order."""
        return shuffled_index(self.size(split), limit, seed)

    def images(self, split: str, index: Tensor) -> tuple[Tensor, Tensor]:
        """The uint8 images ``(n, C, H, W)`` and labels of rows ``index``."""
        part = getattr(self.data, split)
        return part.images(index), part.labels[index]
