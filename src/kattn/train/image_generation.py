"""Task ``image-generation``: the distribution of each sub-pixel given those before it, with
the pixel-level model of Luo et al. 2021, Appendix A.5 (bits/dim; histogram baselines and
samples at the end)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import ImageData
from ..nn import ImageGenerator
from ..nn.image_generator import raster_subpixels
from ..nn.image_tools import histogram_bits_per_dim, image_grid, write_png
from .config import RunConfig
from .images import ImageTask, check_image_fields, image_attention_options


class ImageGeneration(ImageTask):
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
        check_image_fields(config, ("data.image_size",))

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
        return {
            "images": images.to(device, non_blocking=True),
            "targets": raster_subpixels(images).to(device, non_blocking=True),
        }

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["images"])  # (B, L, 256)

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        targets = batch["targets"]
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        targets = batch["targets"]
        return int((logits.argmax(-1) == targets).sum().item()), targets.numel()

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        nats, correct, n = sums
        loss = nats / max(n, 1)
        return {"loss": loss, "bits_per_dim": loss / math.log(2),
                "accuracy": correct / max(n, 1), "subpixels": int(n)}  # fmt: skip

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
        generator = torch.Generator(device=device).manual_seed(self.seed)
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
