"""Task ``image-classification``: images → class logits with a Vision Transformer (Luo et al.
2021, §4.4 and Appendix A.4, after DeiT: Touvron et al. 2021); top-1 during training, top-1
and top-5 of the best model at the end."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import IMAGENET_MEAN, IMAGENET_STD, Augment, ImageData, normalize
from ..nn import VisionTransformer
from .batches import majority_baseline
from .config import RunConfig
from .images import ImageTask, check_image_fields, image_attention_options
from .objective_base import ClassAccuracy


class ImageClassification(ClassAccuracy, ImageTask):
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
        check_image_fields(config, own)
        data = config.data
        if not 0.0 < data.crop_scale <= 1.0:
            raise ValueError(f"data.crop_scale must be in (0, 1], got {data.crop_scale}")
        if data.mixup < 0 or data.cutmix < 0:
            raise ValueError(
                f"data.mixup and data.cutmix are Beta(α, α) parameters ≥ 0 (0: off), got "
                f"{data.mixup} and {data.cutmix}"
            )
        _randaugment(data.randaugment)
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

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """Top-5 accuracy of the best model on valid and test (top-1 is the test metric)."""
        found: dict[str, Any] = {}
        model.eval()
        for split in ("valid", "test"):
            hits, n = 0, 0
            with torch.no_grad():
                for index in torch.arange(self.size(split)).split(256):
                    batch = self.batch(split, index, device)
                    top = model(batch["images"]).topk(min(5, self.data.num_classes), dim=-1)
                    right = top.indices == batch["labels"][:, None]
                    hits += int(right.any(-1).sum())
                    n += len(index)
            found[f"{split}_top5_accuracy"] = hits / max(n, 1)
        return found

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        return {
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "test_examples": test["examples"],
            "best_valid_accuracy": None if best is None else best["accuracy"],
            "majority_baseline": majority_baseline(self.data),
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
