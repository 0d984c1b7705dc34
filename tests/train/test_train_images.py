"""``kattn train --task image-classification`` and ``--task image-generation``: tiny runs
through the one training loop on a CIFAR-10 folder written by the test (results, top-5,
bits/dim against the uniform and histogram baselines, samples as a PNG, the run folder read
back), the 2-D relative positions the image tasks give ``nprf_rpe``, the augmentation's
determinism, and the refusals of fields that belong to other tasks."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data import normalize
from kattn.data.images_cifar import write_cifar10
from kattn.nn.image_tools import histogram_bits_per_dim
from kattn.train import apply_overrides, load_trained_model, preset
from kattn.train.config import RunConfig
from kattn.train.image_classification import ImageClassification
from kattn.train.image_generation import ImageGeneration
from kattn.train.images import image_attention_options
from kattn.train.loop import evaluate_run, train
from kattn.train.validation import validate


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CIFAR-10 folder of 100 training and 40 test images of classes 0–3 (of 10): class k has
    a bright square in quadrant k on a dark background (learnable), with noise."""
    rng = np.random.default_rng(0)

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.arange(n) % 4
        x = rng.integers(0, 60, size=(n, 3, 32, 32), dtype=np.uint8)
        for i, k in enumerate(labels):
            r, c = divmod(int(k), 2)
            x[i, :, 16 * r : 16 * r + 12, 16 * c : 16 * c + 12] += 180
        return x.reshape(n, -1), labels.astype(np.int64)

    folder = tmp_path_factory.mktemp("images") / "cifar-10-batches-py"
    (train_x, train_y), (test_x, test_y) = images(100), images(40)
    write_cifar10(folder, train_x, train_y, test_x, test_y, [f"class{k}" for k in range(10)])
    return folder


def tiny(task: str, folder: Path, *overrides: str) -> RunConfig:
    config = preset("small", task)
    config.data.path = str(folder)
    config.train.device = "cpu"
    return apply_overrides(
        config,
        [
            "model.dim=16", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=32",
            "data.image_size=8", "train.steps=4", "train.batch_size=8", "train.eval_every=2",
            "train.log_every=2", "train.eval_batches=1", "optim.warmup_steps=1",
            "attention.options.num_features=8", *overrides,
        ],
    )  # fmt: skip


def test_image_classification_runs_and_reports_top5(cifar_dir: Path, tmp_path: Path) -> None:
    config = tiny(
        "image-classification", cifar_dir, "model.patch_size=2", "attention.name=nprf_rpe"
    )
    results = train(config, tmp_path / "run", progress=False)
    assert results["task"] == "image-classification"
    assert 0.0 <= results["test_accuracy"] <= results["test_top5_accuracy"] <= 1.0
    assert results["majority_baseline"] == pytest.approx(0.25)  # 10 of each of 4 classes
    assert results["attention_options"]["rpe"] == "toeplitz2d"  # the image's 2-D positions
    assert results["data"]["format"]
    again = evaluate_run(tmp_path / "run", "test", device="cpu")
    assert again["accuracy"] == pytest.approx(results["test_accuracy"])
    model, read, _ = load_trained_model(tmp_path / "run")
    assert type(model).__name__ == "VisionTransformer" and read.data.task == config.data.task


def test_image_generation_reports_baselines_and_samples(cifar_dir: Path, tmp_path: Path) -> None:
    config = tiny("image-generation", cifar_dir, "attention.name=nprf_rpe")
    results = train(config, tmp_path / "run", progress=False)
    assert results["uniform_bits_per_dim"] == 8.0
    data = ImageGeneration.load_data(config)
    everything = (data.train.images(torch.arange(len(data.train))),
                  data.test.images(torch.arange(len(data.test))))  # fmt: skip
    assert results["histogram_bits_per_dim"] == pytest.approx(histogram_bits_per_dim(*everything))
    assert 0.0 < results["test_bits_per_dim"] < 9.0
    assert results["test_bits_per_dim"] == pytest.approx(results["test_loss"] / np.log(2))
    png = (tmp_path / "run" / results["samples"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = (int.from_bytes(png[16 + 4 * i : 20 + 4 * i], "big") for i in range(2))
    start = png.index(b"IDAT") + 4
    raw = zlib.decompress(png[start : start + int.from_bytes(png[start - 8 : start - 4], "big")])
    assert len(raw) == height * (1 + 3 * width)  # one filter byte per row, RGB
    assert width >= 8 * 8 and height >= 8  # eight samples in a row
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["samples"] == "samples.png"


def test_a_mechanism_that_cannot_decode_finishes_without_samples(
    cifar_dir: Path, tmp_path: Path
) -> None:
    config = tiny("image-generation", cifar_dir, "attention.name=longformer", "train.steps=2")
    config.attention.options.clear()  # longformer has no random features
    results = train(config, tmp_path / "run", progress=False)
    assert results["samples"] is None and "no decoding state" in results["samples_skipped"]
    assert not (tmp_path / "run" / "samples.png").exists()
    assert (tmp_path / "run" / "results.json").is_file()


class _Fixed(torch.nn.Module):
    """Logits that put each image's label at rank ``label + 1`` (of 10): the label is in the
    top 5 exactly for labels 0–3, never first."""

    def __init__(self, labels: dict[bytes, int]) -> None:
        super().__init__()
        self.labels = labels

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for image in images:
            label = self.labels[image.numpy().tobytes()]
            order = [c for c in range(10) if c != label]
            order.insert(label + 1, label)
            logits = torch.zeros(10)
            logits[torch.tensor(order)] = torch.arange(10, 0, -1, dtype=torch.float)
            out.append(logits)
        return torch.stack(out)


def test_top5_counts_a_label_among_the_five_best_logits(cifar_dir: Path) -> None:
    config = tiny("image-classification", cifar_dir)
    objective = ImageClassification(config, ImageClassification.load_data(config))
    lookup = {}
    for split in ("valid", "test"):
        part = getattr(objective.data, split)
        for i in range(len(part)):
            batch = objective.batch(split, torch.tensor([i]), torch.device("cpu"))
            lookup[batch["images"][0].numpy().tobytes()] = int(part.labels[i])
    assert len(lookup) == len(objective.data.valid) + len(objective.data.test)  # keys unique
    found = objective.final_results(_Fixed(lookup), torch.device("cpu"))
    for split in ("valid", "test"):
        labels = getattr(objective.data, split).labels
        assert found[f"{split}_top5_accuracy"] == pytest.approx(float((labels <= 3).float().mean()))


def test_the_1d_toeplitz_encoding_becomes_the_2d_one_on_images() -> None:
    config = preset("small", "image-classification")
    config.attention.name = "nprf_rpe"
    assert image_attention_options(config)["rpe"] == "toeplitz2d"
    config.attention.options["rpe"] = None  # NPRF without relative positions stays so
    assert image_attention_options(config)["rpe"] is None
    config.attention.options["rpe"] = "toeplitz"  # a given 1-D encoding is kept
    assert image_attention_options(config)["rpe"] == "toeplitz"
    config.attention.name, config.attention.options = "performer", {}
    assert "rpe" not in image_attention_options(config)


def test_training_batches_are_augmented_reproducibly(cifar_dir: Path) -> None:
    config = tiny("image-classification", cifar_dir, "data.mixup=0.8")
    objective = ImageClassification(config, ImageClassification.load_data(config))
    index, cpu = torch.arange(8), torch.device("cpu")
    batches = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        batches.append(objective.batch("train", index, cpu))
    assert torch.equal(batches[0]["images"], batches[1]["images"])
    assert not torch.equal(batches[0]["images"], batches[2]["images"])
    assert batches[0]["targets"].shape == (8, 10)  # mixed soft targets over the 10 classes
    torch.testing.assert_close(batches[0]["targets"].sum(-1), torch.ones(8))
    images, _ = objective.images("train", index)
    plain = normalize(images.float() / 255.0)
    with torch.no_grad():  # an evaluation of the train split reads the images as they are
        evaluated = objective.batch("train", index, cpu)
    assert torch.equal(evaluated["images"], plain)
    assert torch.equal(evaluated["targets"], evaluated["labels"])
    valid = objective.batch("valid", index[:4], cpu)
    assert torch.equal(valid["images"], normalize(objective.images("valid", index[:4])[0] / 255.0))


@pytest.mark.parametrize(
    ("task", "key", "value", "message"),
    [
        ("lm", "data.mixup", "0.5", "data.mixup is for image-classification, not lm"),
        ("listops", "model.patch_size", "4", "model.patch_size is for image-classification"),
        ("image-generation", "data.cutmix", "1.0", "data.cutmix is for image-classification"),
        ("image-classification", "data.max_len", "64", "data.max_len is not used"),
        ("image-classification", "data.randaugment", '"2"', "data.randaugment must be 'N,M'"),
        ("image-classification", "data.crop_scale", "0", "data.crop_scale must be in"),
        ("image-generation", "optim.label_smoothing", "0.1", "is for task translation"),
        ("image-classification", "model.positions", '"sinusoidal"', "learned or none"),
        ("image-classification", "model.block_skip", "true", "model.block_skip is not used"),
        ("image-generation", "model.norm_first", "false", "model.norm_first is not used"),
        ("image-generation", "model.patch_size", "4", "model.patch_size is for image-class"),
        ("image-classification", "model.patch_size", "0", "positive number of pixels"),
    ],
)
def test_fields_of_other_tasks_are_refused(task: str, key: str, value: str, message: str) -> None:
    config = apply_overrides(preset("small", task), [f"{key}={value}"])
    with pytest.raises(ValueError, match=message):
        validate(config)
