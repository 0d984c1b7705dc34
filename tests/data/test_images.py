"""load_images on tiny files in each released layout: CIFAR-10, CIFAR-100, downsampled
ImageNet (.npz and pickles) and ImageNet-style folders; shapes, labels, classes and splits;
malformed files raise DataFormatError naming the file."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data import DataFormatError, ImageData, load_images
from kattn.data.images_cifar import write_cifar10
from kattn.data.images_splits import resize_images


def dump(path: Path, obj: object) -> None:
    with path.open("wb") as file:
        pickle.dump(obj, file)


def rows(n: int, side: int, start: int) -> np.ndarray:
    """``n`` rows of ``3·side·side`` bytes; row k is filled with ``start + k`` except that its
    R plane's first pixel is 255 and its B plane's last pixel is 7."""
    data = np.empty((n, 3 * side * side), dtype=np.uint8)
    for k in range(n):
        data[k] = (start + k) % 256
    data[:, 0] = 255
    data[:, -1] = 7
    return data


def write_cifar10_tiny(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    train = rows(20, 32, 0)
    test = rows(3, 32, 100)
    names = [f"class{k}" for k in range(10)]
    write_cifar10(folder, train, np.arange(20) % 10, test, np.array([3, 4, 5]), names)
    return folder


def test_cifar10_splits_shapes_and_classes(tmp_path: Path) -> None:
    write_cifar10_tiny(tmp_path)
    data = load_images(tmp_path)
    assert isinstance(data, ImageData)
    assert (len(data.train), len(data.valid), len(data.test)) == (18, 2, 3)
    assert data.classes == [f"class{k}" for k in range(10)]
    assert (data.num_classes, data.channels, data.size) == (10, 3, (32, 32))
    assert data.train.labels.tolist() == [k % 10 for k in range(18)]
    assert data.valid.labels.tolist() == [8, 9]  # train[18:], the last 10%
    assert data.test.labels.tolist() == [3, 4, 5]
    images = data.valid.images(torch.tensor([1, 0]))
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.uint8
    # row 19: every byte 19, except R(0, 0) = 255 and B(31, 31) = 7 (channel-planar rows)
    assert images[0, 0, 0, 0] == 255 and images[0, 2, 31, 31] == 7
    assert images[0, 1].unique().tolist() == [19] and images[1, 1].unique().tolist() == [18]
    assert data.test.images(torch.tensor([-1]))[0, 1, 5, 5] == 102
    source = data.source
    assert source["format"] == "cifar10-python"
    assert source["sizes"] == {"train": 18, "valid": 2, "test": 3}
    assert source["valid"] == "the last 2 of 20 train images (train[18:])"
    assert json.loads(json.dumps(source)) == source  # results.json records it


def test_cifar10_resize_is_antialiased_bilinear(tmp_path: Path) -> None:
    write_cifar10_tiny(tmp_path)
    data = load_images(tmp_path / "cifar-10-batches-py", image_size=16)
    assert data.size == (16, 16) and "bilinear" in data.source["resize"]
    full = load_images(tmp_path).train.images(torch.arange(4))
    small = data.train.images(torch.arange(4))
    assert small.shape == (4, 3, 16, 16)
    expected = torch.nn.functional.interpolate(
        full.double(), size=(16, 16), mode="bilinear", antialias=True
    )
    assert (small.double() - expected).abs().max() <= 0.5 + 1e-6  # rounded to uint8
    assert resize_images(full, 32) is full


def test_split_index_errors(tmp_path: Path) -> None:
    write_cifar10_tiny(tmp_path)
    data = load_images(tmp_path)
    with pytest.raises(IndexError, match="the split has 2"):
        data.valid.images(torch.tensor([2]))
    with pytest.raises(TypeError, match="integer row numbers"):
        data.valid.images(torch.tensor([True, False]))


def test_cifar10_meta_names_the_file(tmp_path: Path) -> None:
    folder = write_cifar10_tiny(tmp_path)
    dump(folder / "batches.meta", {b"label_names": [b"a", b"b"]})
    with pytest.raises(DataFormatError, match="must list the 10 class names") as err:
        load_images(tmp_path)
    assert str(folder / "batches.meta") in str(err.value)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "not a readable CIFAR-10 batch"),
        (lambda p: p.unlink(), "is missing"),
        (
            lambda p: dump(p, {b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}),
            r"\(N, 3072\) uint8",
        ),
        (
            lambda p: dump(p, {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}),
            "must be in 0-9",
        ),
    ],
    ids=["truncated", "missing", "row-length", "label"],
)
def test_cifar10_bad_batch_names_the_file(tmp_path: Path, damage, message: str) -> None:
    folder = write_cifar10_tiny(tmp_path)
    damage(folder / "data_batch_3")
    with pytest.raises(DataFormatError, match=message) as err:
        load_images(tmp_path)
    assert str(folder / "data_batch_3") in str(err.value)


def write_cifar100(root: Path, test_labels: list[int] | None = None) -> Path:
    folder = root / "cifar-100-python"
    folder.mkdir()
    train = {b"data": rows(10, 32, 0), b"fine_labels": [99, *range(9)], b"coarse_labels": [0] * 10}
    labels = [50, 60] if test_labels is None else test_labels
    test = {b"data": rows(2, 32, 50), b"fine_labels": labels, b"coarse_labels": [0, 0]}
    meta = {b"fine_label_names": [f"fine{k}".encode() for k in range(100)]}
    for name, obj in (("train", train), ("test", test), ("meta", meta)):
        with (folder / name).open("wb") as file:
            pickle.dump(obj, file, protocol=2)
    return folder


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    data = load_images(tmp_path)
    assert (data.num_classes, data.source["format"]) == (100, "cifar100-python")
    assert data.classes[99] == "fine99"
    assert (len(data.train), len(data.valid), len(data.test)) == (9, 1, 2)
    assert data.train.labels.tolist() == [99, *range(8)]
    assert data.valid.labels.tolist() == [8]
    assert data.test.labels.tolist() == [50, 60]
    assert data.test.images(torch.tensor([1]))[0, 1, 3, 3] == 51


def test_cifar100_bad_label_names_the_file(tmp_path: Path) -> None:
    folder = write_cifar100(tmp_path, test_labels=[50, 100])
    with pytest.raises(DataFormatError, match=r"b'fine_labels' must be in 0-99") as err:
        load_images(tmp_path)
    assert str(folder / "test") in str(err.value)


def write_downsampled(root: Path, *, npz: bool, side: int = 4, per_batch: int = 3) -> Path:
    """Ten train batches of ``per_batch`` images (labels 1-based, image k labelled k % 1000 + 1)
    and a val_data of 5 images, in separate folders as the release's archives unpack."""
    train_dir, val_dir = root / "Imagenet_train", root / "Imagenet_val"
    train_dir.mkdir(parents=True)
    val_dir.mkdir()
    k = 0
    for i in range(1, 11):
        labels = [(k + j) % 1000 + 1 for j in range(per_batch)]
        save(train_dir / f"train_data_batch_{i}", rows(per_batch, side, k), labels, npz=npz)
        k += per_batch
    save(val_dir / "val_data", rows(5, side, 200), [1000, 1, 2, 3, 4], npz=npz)
    return root


def save(path: Path, data: np.ndarray, labels: list[int], *, npz: bool) -> None:
    batch = {"data": data, "labels": labels, "mean": data.mean(0)}
    if npz:
        np.savez(path.with_suffix(".npz"), **batch)
    else:
        dump(path, batch)


@pytest.mark.parametrize("npz", [True, False], ids=["npz", "pickle"])
def test_downsampled_imagenet(tmp_path: Path, npz: bool) -> None:
    write_downsampled(tmp_path, npz=npz)
    data = load_images(tmp_path, seed=3)
    assert (data.num_classes, data.channels, data.size) == (1000, 3, (4, 4))
    assert data.classes[0] == "1" and data.classes[999] == "1000"
    assert (len(data.train), len(data.valid), len(data.test)) == (27, 3, 5)
    assert data.test.labels.tolist() == [999, 0, 1, 2, 3]  # 0-based
    # train and valid partition the 30 train images (label k of image k), each in file order
    ids = sorted(data.train.labels.tolist() + data.valid.labels.tolist())
    assert ids == list(range(30))
    assert data.train.labels.tolist() == sorted(data.train.labels.tolist())
    images = data.valid.images(torch.arange(3))
    assert images.shape == (3, 3, 4, 4)
    assert images[:, 1, 2, 2].tolist() == data.valid.labels.tolist()  # row k filled with k
    assert images[:, 0, 0, 0].tolist() == [255] * 3 and images[:, 2, 3, 3].tolist() == [7] * 3
    again = load_images(tmp_path, seed=3)
    other = load_images(tmp_path, seed=4)
    assert torch.equal(again.valid.labels, data.valid.labels)
    assert not torch.equal(other.valid.labels, data.valid.labels)
    assert data.source["format"] == "downsampled-imagenet" and "3 of 30" in data.source["valid"]
    assert json.loads(json.dumps(data.source)) == data.source
    assert load_images(tmp_path, image_size=8).test.images(torch.arange(2)).shape == (2, 3, 8, 8)


def test_downsampled_errors_name_the_file(tmp_path: Path) -> None:
    write_downsampled(tmp_path, npz=True)
    batch = tmp_path / "Imagenet_train" / "train_data_batch_4.npz"
    np.savez(batch, data=rows(3, 4, 0), mean=np.zeros(48))
    with pytest.raises(DataFormatError, match="lacks labels") as err:
        load_images(tmp_path)
    assert str(batch) in str(err.value)
    np.savez(batch, data=np.zeros((3, 50), np.uint8), labels=[1, 2, 3])
    with pytest.raises(DataFormatError, match="rows of 50 bytes") as err:
        load_images(tmp_path)
    assert str(batch) in str(err.value)
    np.savez(batch, data=rows(3, 4, 0), labels=[1, 0, 3])
    with pytest.raises(DataFormatError, match=r"must be in 1-1000, got 0\.\.3") as err:
        load_images(tmp_path)
    assert str(batch) in str(err.value)
    np.savez(batch, data=rows(3, 8, 0), labels=[1, 2, 3])
    with pytest.raises(DataFormatError, match="8x8 images, the files before it 4x4"):
        load_images(tmp_path)
    batch.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataFormatError, match="not a readable downsampled ImageNet") as err:
        load_images(tmp_path)
    assert str(batch) in str(err.value)
    batch.unlink()
    with pytest.raises(DataFormatError, match="lacks train_data_batch_4"):
        load_images(tmp_path)


def test_downsampled_pickle_is_restricted(tmp_path: Path) -> None:
    write_downsampled(tmp_path, npz=False)
    val = tmp_path / "Imagenet_val" / "val_data"
    dump(val, {"data": Path("x"), "labels": [1]})
    with pytest.raises(DataFormatError, match="refusing to load pathlib") as err:
        load_images(tmp_path)
    assert str(val) in str(err.value)
    val.write_bytes(pickle.dumps({"data": rows(2, 4, 0), "labels": [1, 2]})[:-30])
    with pytest.raises(DataFormatError, match="not a readable") as err:
        load_images(tmp_path)
    assert str(val) in str(err.value)


def test_unknown_folder_lists_the_formats(tmp_path: Path) -> None:
    (tmp_path / "something.txt").write_text("x")
    with pytest.raises(ValueError, match="holds no image data set") as err:
        load_images(tmp_path)
    for known in ("CIFAR-10", "CIFAR-100", "downsampled ImageNet", "ImageNet-style folder"):
        assert known in str(err.value)
    with pytest.raises(ValueError, match="is not a folder"):
        load_images(tmp_path / "absent")
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        load_images(tmp_path, image_size=0)
