"""The embedded shape set: deterministic files (same sha256 twice), balanced classes, written
in CIFAR-10's layout and read back through the CIFAR reader, classes that the mean colour
does not give away, and no temporary folder left by a failed or lost first write."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data import SHAPE_CLASSES, embedded_images, generate_shapes, image_embedded, load_images
from kattn.data.image_embedded import EMBEDDED_IMAGES, EMBEDDED_IMAGES_VERSION
from kattn.data.images_cifar import write_cifar10


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kattn-cache")


def test_embedded_set_is_deterministic_and_cifar_shaped(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KATTN_CACHE", str(cache))
    assert not embedded_images(create=False).exists()
    data = load_images(None)
    folder = embedded_images(create=False)
    assert folder.parent == cache / "images" and f"-v{EMBEDDED_IMAGES_VERSION}-" in folder.name
    assert sorted(p.name for p in folder.iterdir()) == [
        "batches.meta",
        *[f"data_batch_{i}" for i in range(1, 6)],
        "test_batch",
    ]
    with (folder / "data_batch_1").open("rb") as file:
        batch = pickle.load(file, encoding="bytes")  # the usual CIFAR-10 loading code
    assert batch[b"data"].shape == (2000, 3072) and len(batch[b"labels"]) == 2000
    assert (len(data.train), len(data.valid), len(data.test)) == (9000, 1000, 2000)
    assert data.classes == list(SHAPE_CLASSES) and (data.channels, data.size) == (3, (32, 32))
    source = data.source
    assert source["parameters"] == EMBEDDED_IMAGES and source["version"] == 1
    assert source["format"].startswith("embedded") and set(source["sha256"]) == {
        p.name for p in folder.iterdir()
    }
    assert json.loads(json.dumps(source)) == source
    # a second cache generates the same bytes
    monkeypatch.setenv("KATTN_CACHE", str(tmp_path))
    again = load_images(None)
    assert embedded_images(create=False).parent == tmp_path / "images"
    assert again.source["sha256"] == source["sha256"]


def test_embedded_classes_are_balanced_and_not_told_by_colour(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KATTN_CACHE", str(cache))
    data = load_images(None)
    assert torch.bincount(data.test.labels, minlength=10).tolist() == [200] * 10
    train_counts = torch.bincount(data.train.labels, minlength=10)
    valid_counts = torch.bincount(data.valid.labels, minlength=10)
    assert (train_counts + valid_counts).tolist() == [1000] * 10
    train = data.train.images(torch.arange(len(data.train))).double()
    test = data.test.images(torch.arange(len(data.test))).double()
    # nearest class mean on the mean RGB of each image: about chance (10 %)
    mean, test_mean = train.mean((2, 3)), test.mean((2, 3))
    centres = torch.stack([mean[data.train.labels == k].mean(0) for k in range(10)])
    predicted = torch.cdist(test_mean, centres).argmin(1)
    assert (predicted == data.test.labels).double().mean() < 0.15

    # while the same classifier on a shift-invariant picture of the shape (log |FFT| of the
    # image less its mean colour, summed over channels) tells most classes apart
    def spectrum(images: torch.Tensor) -> torch.Tensor:
        centred = images - images.mean((2, 3), keepdim=True)
        return torch.log1p(torch.fft.fft2(centred).abs().sum(1)).flatten(1)

    shapes, test_shapes = spectrum(train), spectrum(test)
    centres = torch.stack([shapes[data.train.labels == k].mean(0) for k in range(10)])
    predicted = torch.cdist(test_shapes, centres).argmin(1)
    assert (predicted == data.test.labels).double().mean() > 0.6


def test_generate_shapes_seeded() -> None:
    images, labels = generate_shapes(50, seed=7)
    again, labels_again = generate_shapes(50, seed=7)
    other, _ = generate_shapes(50, seed=8)
    assert images.shape == (50, 3, 32, 32) and images.dtype == np.uint8
    assert np.array_equal(images, again) and np.array_equal(labels, labels_again)
    assert not np.array_equal(images, other)
    assert np.bincount(labels).tolist() == [5] * 10
    with pytest.raises(ValueError, match="max_radius"):
        generate_shapes(10, seed=0, max_radius=20.0)


@pytest.fixture
def tiny_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache under ``tmp_path`` and an embedded set of 50 + 10 images (fast to write)."""
    monkeypatch.setenv("KATTN_CACHE", str(tmp_path))
    monkeypatch.setitem(EMBEDDED_IMAGES, "num_train", 50)
    monkeypatch.setitem(EMBEDDED_IMAGES, "num_test", 10)
    return tmp_path / "images"


def test_a_failed_write_leaves_no_temporary_folder(
    tiny_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def write_then_fail(folder: Path, *args: object) -> None:
        write_cifar10(folder, *args)  # type: ignore[arg-type]
        raise OSError("No space left on device")

    monkeypatch.setattr(image_embedded, "write_cifar10", write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        embedded_images()
    assert list(tiny_set.iterdir()) == []  # neither the set nor its .tmpPID folder


def test_losing_the_rename_to_another_process_leaves_no_temporary_folder(
    tiny_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def write_while_another_finishes(folder: Path, *args: object) -> None:
        write_cifar10(folder, *args)  # type: ignore[arg-type]
        write_cifar10(embedded_images(create=False), *args)  # type: ignore[arg-type]

    monkeypatch.setattr(image_embedded, "write_cifar10", write_while_another_finishes)
    folder = embedded_images()
    assert [p.name for p in tiny_set.iterdir()] == [folder.name]  # the winner's set only
    assert len(load_images(None).train) == 45
