"""The image tasks: classification with a Vision Transformer (Luo et al. 2021, §4.4 and
Appendix A.4, after DeiT: Touvron et al. 2021) and pixel-level generation (Luo et al. 2021,
Appendix A.5).

Both read :class:`~kattn.data.ImageData` (:func:`kattn.data.load_images`: CIFAR-10/100, an
ImageNet-style folder, downsampled ImageNet, or the embedded generated shapes). Relative
positions are those of the image: a mechanism whose encoding is the 1-D Toeplitz one
(``nprf_rpe``'s default) gets the 2-D one (``toeplitz2d``) on the patch grid (classification)
or the (row, sub-pixel column) grid (generation); ``results.json`` records the options used.

Summed statistics are ``[loss_sum, correct, count]`` as for the other tasks (count: images,
or sub-pixels for generation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import IMAGENET_MEAN, IMAGENET_STD, Augment, ImageData, load_images, normalize
from ..nn import ImageGenerator, VisionTransformer
from ..nn.image_generator import raster_subpixels
from ..nn.image_tools import histogram_bits_per_dim, image_grid, write_png
from ..registry import spec
from .config import ModelConfig, RunConfig
from .field_checks import refuse_image_fields, refuse_translation_fields
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


#: the model fields each image task reads; the others must keep their defaults.
MODEL_FIELDS = {
    "image-classification": ("dim", "num_layers", "num_heads", "ffn_dim", "pooling",
                             "positions", "norm_first", "dropout", "attention_dropout",
                             "patch_size", "drop_path"),
    "image-generation": ("dim", "num_layers", "num_heads", "ffn_dim", "positions", "dropout",
                         "attention_dropout"),
}  # fmt: skip


def _check_model_fields(config: RunConfig) -> None:
    task, model, default = config.data.task, config.model, ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name not in MODEL_FIELDS[task] and getattr(model, f.name) != getattr(default, f.name):
            raise ValueError(
                f"model.{f.name} is not used by task {task} (it reads model."
                f"{', model.'.join(MODEL_FIELDS[task])})"
            )
    if model.positions not in ("learned", "none"):
        raise ValueError(
            f"model.positions must be learned or none for task {task}, got {model.positions!r}"
        )
    if model.patch_size is not None and model.patch_size < 1:
        raise ValueError(
            f"model.patch_size must be a positive number of pixels, got {model.patch_size}"
        )


def _check_fields(config: RunConfig, allow: tuple[str, ...]) -> None:
    """Refuse the fields of the other tasks; ``allow``: the image and smoothing fields the
    task reads (dotted)."""
    for key in _SEQUENCE_FIELDS:
        if getattr(config.data, key) is not None:
            raise ValueError(f"data.{key} is not used by task {config.data.task}")
    refuse_translation_fields(config, allow=allow)
    refuse_image_fields(config, allow=allow)
    _check_model_fields(config)
    size = config.data.image_size
    if size is not None and size < 1:
        raise ValueError(f"data.image_size must be a positive number of pixels, got {size}")


class _Images(Objective[ImageData]):
    """What both image tasks share: the data, its splits and the batches of images."""

    embedded_data = "the embedded generated shapes (32×32 RGB, 10 classes)"
    unit = "images"

    def __init__(self, config: RunConfig, data: ImageData) -> None:
        super().__init__(config, data)
        self.task = config.data.task
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


class ImageClassification(_Images):
    """Images → class logits with :class:`~kattn.nn.VisionTransformer`; best = highest
    validation accuracy. Training batches are augmented (``data.crop_scale``, ``flip``,
    ``randaugment``, ``mixup``, ``cutmix``) and the loss is cross entropy with
    ``optim.label_smoothing`` against the (mixed) targets; evaluation reads the images as
    they are. The finished run adds top-5 accuracy on valid and test."""

    task = "image-classification"
    best_metric, higher_is_better = "accuracy", True
    count_key = "examples"
    shown = ("loss", "accuracy", "steps_per_s")
    paper_preset = "luo-deit"
    summary_keys = ("task", "mechanism", "steps", "test_accuracy", "test_top5_accuracy",
                    "best_valid_accuracy", "majority_baseline", "wall_time_s",
                    "steps_per_s")  # fmt: skip

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        own = ("data.image_size", "data.crop_scale", "data.flip", "data.randaugment",
               "data.mixup", "data.cutmix", "model.patch_size", "model.drop_path",
               "optim.label_smoothing")  # fmt: skip
        _check_fields(config, own)
        data, optim = config.data, config.optim
        if not 0.0 < data.crop_scale <= 1.0:
            raise ValueError(f"data.crop_scale must be in (0, 1], got {data.crop_scale}")
        if data.mixup < 0 or data.cutmix < 0:
            raise ValueError(
                f"data.mixup and data.cutmix are Beta(α, α) parameters ≥ 0 (0: off), got "
                f"{data.mixup} and {data.cutmix}"
            )
        _randaugment(data.randaugment)
        if not 0.0 <= optim.label_smoothing < 1.0:
            raise ValueError(
                f"optim.label_smoothing must be in [0, 1), got {optim.label_smoothing}"
            )
        if config.model.pooling not in ("mean", "cls"):
            raise ValueError(
                f"model.pooling must be mean (global average pooling) or cls for images, got "
                f"{config.model.pooling!r}"
            )

    def __init__(self, config: RunConfig, data: ImageData) -> None:
        super().__init__(config, data)
        self.smoothing = config.optim.label_smoothing
        d = config.data
        self.augment = Augment(
            data.size[0],
            crop_scale=(d.crop_scale, 1.0),
            flip=d.flip,
            randaugment=_randaugment(d.randaugment),
            mixup=d.mixup,
            cutmix=d.cutmix,
            num_classes=data.num_classes,
        )
        self.options = image_attention_options(config)

    def build_model(self, config: RunConfig) -> nn.Module:
        m, data = config.model, self.data
        return VisionTransformer(
            image_size=data.size,
            patch_size=4 if m.patch_size is None else m.patch_size,
            in_channels=data.channels,
            num_classes=data.num_classes,
            dim=m.dim,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            ffn_dim=m.ffn_dim,
            mechanism=config.attention.name,
            pooling="gap" if m.pooling == "mean" else "cls",
            positions=m.positions,
            drop_path=m.drop_path,
            dropout=m.dropout,
            attention_dropout=m.attention_dropout,
            norm_first=m.norm_first,
            **self.options,
        )

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        images, labels = self.images(split, index)
        if split == "train" and torch.is_grad_enabled():
            # a training step (evaluations run without gradients and read the images as they
            # are); seeded: the loop seeds torch's generator at every step
            seed = int(torch.randint(0, 2**62, ()).item())
            x, targets = self.augment(images, labels, torch.Generator().manual_seed(seed))
        else:
            x, targets = images.float() / 255.0, labels
        x = normalize(x, IMAGENET_MEAN[: x.shape[1]], IMAGENET_STD[: x.shape[1]])
        return {
            "images": x.to(device, non_blocking=True),
            "targets": targets.to(device, non_blocking=True),
            "labels": labels.to(device, non_blocking=True),
        }

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["images"])

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        """Label-smoothed cross entropy against the (mixed) targets for training; the plain
        negative log-likelihood for the sums of an evaluation (``reduction="sum"``)."""
        smoothing = self.smoothing if reduction == "mean" else 0.0
        return F.cross_entropy(
            logits.float(), batch["targets"], label_smoothing=smoothing, reduction=reduction
        )

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        labels = batch["labels"]
        return int((logits.argmax(-1) == labels).sum().item()), len(labels)

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        loss, correct, n = sums
        return {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1), "examples": int(n)}

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """Top-1 and top-5 accuracy of the best model on valid and test."""
        found: dict[str, Any] = {}
        model.eval()
        for split in ("valid", "test"):
            hits, n = torch.zeros(2), 0
            with torch.no_grad():
                for index in torch.arange(self.size(split)).split(256):
                    batch = self.batch(split, index, device)
                    top = model(batch["images"]).topk(min(5, self.data.num_classes), dim=-1)
                    right = top.indices == batch["labels"][:, None]
                    hits += torch.stack([right[:, 0].sum(), right.any(-1).sum()]).cpu()
                    n += len(index)
            found[f"{split}_top5_accuracy"] = float(hits[1]) / max(n, 1)
        return found

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        return {
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "test_examples": test["examples"],
            "best_valid_accuracy": None if best is None else best["accuracy"],
            "majority_baseline": majority_share(self.data),
            "attention_options": self.options,
            "data": self.data.source,
        }

    def summary(self, results: dict[str, Any]) -> str:
        return (
            f"test accuracy {results['test_accuracy']:.4f} (top-5 "
            f"{results.get('test_top5_accuracy', float('nan')):.4f}; best valid "
            f"{results['best_valid_accuracy']} at step {results['best_step']}); majority "
            f"baseline {results['majority_baseline']:.4f}"
        )


def _randaugment(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    parts = value.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"data.randaugment must be 'N,M' (two integers), got {value!r}")
    return int(parts[0]), int(parts[1])


class ImageGeneration(_Images):
    """Images → the distribution of each sub-pixel given the ones before it in (row, column,
    channel) order, with :class:`~kattn.nn.ImageGenerator`; best = lowest validation loss.
    Metrics: ``loss`` (nats per sub-pixel), ``bits_per_dim`` = loss / ln 2 (the papers'
    BPD) and next-value ``accuracy``. The finished run adds the bits/dim of a uniform model
    (8) and of histograms fitted on the training images, and samples images into the run
    folder (``samples.png``)."""

    task = "image-generation"
    best_metric, higher_is_better = "loss", False
    count_key = "subpixels"
    shown = ("loss", "bits_per_dim", "steps_per_s")
    paper_preset = "luo-imagenet32"
    needs_causal = True
    summary_keys = ("task", "mechanism", "steps", "test_bits_per_dim",
                    "best_valid_bits_per_dim", "histogram_bits_per_dim",
                    "uniform_bits_per_dim", "wall_time_s", "steps_per_s")  # fmt: skip
    #: images sampled at the end of a run (one row of ``samples.png``, enlarged to at least
    #: 128 pixels a side by repeating pixels).
    num_samples = 8

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        _check_fields(config, ("data.image_size",))

    def __init__(self, config: RunConfig, data: ImageData) -> None:
        super().__init__(config, data)
        self.options = image_attention_options(config)
        self.seed, self.mechanism = config.train.seed, config.attention.name
        self.run_dir: Path | None = None

    def build_model(self, config: RunConfig) -> nn.Module:
        m, data = config.model, self.data
        return ImageGenerator(
            image_size=data.size,
            channels=data.channels,
            dim=m.dim,
            depth=m.num_layers,
            num_heads=m.num_heads,
            ffn_dim=m.ffn_dim,
            mechanism=config.attention.name,
            positions=m.positions,
            dropout=m.dropout,
            attention_dropout=m.attention_dropout,
            **self.options,
        )

    def write_run_files(self, run_dir: Path) -> None:
        """Nothing yet; the run folder is where the samples go at the end."""
        self.run_dir = run_dir

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        images, _ = self.images(split, index)
        return {"images": images.to(device, non_blocking=True)}

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["images"])  # (B, L, 256)

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        targets = raster_subpixels(batch["images"])
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        targets = raster_subpixels(batch["images"])
        return int((logits.argmax(-1) == targets).sum().item()), targets.numel()

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        nats, correct, n = sums
        loss = nats / max(n, 1)
        return {"loss": loss, "bits_per_dim": loss / math.log(2),
                "accuracy": correct / max(n, 1), "subpixels": int(n)}  # fmt: skip

    def rates(self, steps: int, seconds: float, batch_size: int) -> dict[str, float]:
        return {"steps_per_s": steps / max(seconds, 1e-9)}

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """The histogram baselines (fitted on at most :data:`HISTOGRAM_IMAGES` training images,
        scored on all of test), and samples of the best model written to the run folder
        (skipped, with the reason, for a mechanism that cannot decode)."""
        found: dict[str, Any] = {"uniform_bits_per_dim": 8.0}
        train = _chunks(self.data.train, HISTOGRAM_IMAGES, self.seed)
        test = _chunks(self.data.test, None, self.seed)
        found["histogram_bits_per_dim"] = histogram_bits_per_dim(train, test)
        found["histogram_train_images"] = min(HISTOGRAM_IMAGES, len(self.data.train))
        if self.run_dir is None:
            return found
        if not model.supports_sampling:
            found["samples"] = None
            found["samples_skipped"] = (
                f"{self.mechanism} has no decoding state (supports_recurrent is False): "
                "sampling needs one"
            )
            return found
        model.eval()
        generator = torch.Generator(device=device).manual_seed(self.seed)
        with torch.no_grad():
            samples = model.sample(self.num_samples, generator=generator)  # type: ignore[operator]
        path = self.run_dir / "samples.png"
        grid = image_grid(samples.cpu(), nrow=self.num_samples)
        zoom = max(1, 128 // max(self.data.size))  # small images, shown larger
        write_png(path, grid.repeat_interleave(zoom, 1).repeat_interleave(zoom, 2))
        found["samples"] = path.name
        return found

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        results: dict[str, Any] = {f"test_{k}": v for k, v in test.items()}
        for key in ("loss", "bits_per_dim", "accuracy"):
            results[f"best_valid_{key}"] = None if best is None else best[key]
        results["attention_options"] = self.options
        results["data"] = self.data.source
        return results

    def summary(self, results: dict[str, Any]) -> str:
        hist = results.get("histogram_bits_per_dim") or {}
        shown = ", ".join(f"{k} {v:.3f}" for k, v in hist.items() if isinstance(v, float))
        return (
            f"test {results['test_bits_per_dim']:.4f} bits/dim (best valid "
            f"{results['best_valid_bits_per_dim']} at step {results['best_step']}); uniform "
            f"8.0, histograms: {shown or 'n/a'}"
        )


#: training images the histogram baselines are fitted on (a seeded sample beyond that).
HISTOGRAM_IMAGES = 50_000


def _chunks(split: Any, limit: int | None, seed: int, size: int = 1024) -> Iterator[Tensor]:
    """The images of ``split`` in chunks of ``size``: all of them in order, or a seeded
    sample of ``limit``."""
    n = len(split)
    index = torch.arange(n)
    if limit is not None and limit < n:
        index = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:limit]
    for part in index.split(size):
        yield split.images(part)


def majority_share(data: ImageData) -> float:
    """The accuracy of always answering the commonest training label, on test (the LRA
    tasks' majority baseline)."""
    top = int(torch.bincount(data.train.labels, minlength=data.num_classes).argmax())
    return float((data.test.labels == top).float().mean()) if len(data.test) else 0.0
