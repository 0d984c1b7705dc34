"""load_images on an ImageNet-style folder (train/<class>/, val/<class>/, optional test/):
classes, splits, DeiT's resize and centre crop, lazy decoding errors naming the file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data import DataFormatError, load_images

Image = pytest.importorskip("PIL.Image", reason="image folders are decoded with Pillow")


def pattern(height: int, width: int, seed: int) -> np.ndarray:
    """A seeded random ``(H, W, 3)`` uint8 picture."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_folder(root: Path, *, test: bool = False) -> dict[str, np.ndarray]:
    """train: cat (2 PNGs 9×9), dog (1 PNG 12×18, 1 greyscale PNG); val: one each; test: one
    dog when asked. Returns the pictures by file name."""
    pictures = {}

    def put(path: Path, picture: np.ndarray) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture).save(path)
        pictures[f"{path.parent.parent.name}/{path.parent.name}/{path.name}"] = picture

    put(root / "train" / "cat" / "a.png", pattern(9, 9, 0))
    put(root / "train" / "cat" / "b.PNG", pattern(9, 9, 1))
    put(root / "train" / "dog" / "c.png", pattern(12, 18, 2))
    put(root / "train" / "dog" / "d.png", pattern(9, 9, 3)[:, :, 0])  # greyscale
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    put(root / "val" / "dog" / "e.png", pattern(9, 9, 4))
    put(root / "val" / "cat" / "f.png", pattern(9, 9, 5))
    if test:
        put(root / "test" / "dog" / "g.png", pattern(9, 9, 6))
    return pictures


def test_folder_classes_splits_and_crop(tmp_path: Path) -> None:
    pictures = write_folder(tmp_path)
    data = load_images(tmp_path, image_size=8)
    assert data.classes == ["cat", "dog"] and data.num_classes == 2
    assert (data.channels, data.size) == (3, (8, 8))
    assert data.train.labels.tolist() == [0, 0, 1, 1]  # notes.txt is not an image
    assert data.valid.labels.tolist() == [0, 1]  # cat/f, dog/e (classes in sorted order)
    assert data.test is data.valid and "no test/" in data.source["test"]
    assert data.source["format"] == "image-folder"
    assert data.source["sizes"] == {"train": 4, "valid": 2, "test": 2}
    images = data.train.images(torch.tensor([0, 1, 3]))
    assert images.shape == (3, 3, 8, 8) and images.dtype == torch.uint8
    # 9×9 at image_size 8: the shorter side is already round(8 / 0.875) = 9, so no resize, and
    # the centre crop starts at round((9 − 8) / 2) = 0
    expected = torch.from_numpy(pictures["train/cat/a.png"][:8, :8]).permute(2, 0, 1)
    assert torch.equal(images[0], expected)
    grey = torch.from_numpy(pictures["train/dog/d.png"][:8, :8])
    assert torch.equal(images[2], grey.expand(3, 8, 8))  # greyscale made RGB


def test_folder_resize_keeps_the_aspect_and_crops_the_centre(tmp_path: Path) -> None:
    write_folder(tmp_path)
    picture = np.zeros((12, 18, 3), dtype=np.uint8)
    picture[:, :9] = (255, 0, 0)  # left half red, right half blue
    picture[:, 9:] = (0, 0, 255)
    Image.fromarray(picture).save(tmp_path / "train" / "dog" / "c.png")
    image = load_images(tmp_path, image_size=8).train.images(torch.tensor([2]))[0]
    # 18×12 → 13×9 (shorter side 9), crop columns 2..9: red on the left, blue on the right
    assert image[0, :, 0].tolist() == [255] * 8 and image[2, :, 0].tolist() == [0] * 8
    assert image[0, :, -1].tolist() == [0] * 8 and image[2, :, -1].tolist() == [255] * 8


def test_folder_test_split(tmp_path: Path) -> None:
    write_folder(tmp_path, test=True)
    data = load_images(tmp_path, image_size=8)
    assert data.test is not data.valid and data.test.labels.tolist() == [1]
    assert data.source["test"] == "test/"


def test_folder_needs_image_size(tmp_path: Path) -> None:
    write_folder(tmp_path)
    with pytest.raises(ValueError, match="pass image_size"):
        load_images(tmp_path)


def test_folder_errors_name_the_file(tmp_path: Path) -> None:
    write_folder(tmp_path)
    broken = tmp_path / "train" / "cat" / "b.PNG"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated
    data = load_images(tmp_path, image_size=8)  # decoding is lazy
    with pytest.raises(DataFormatError, match="is not a readable image") as err:
        data.train.images(torch.tensor([1]))
    assert str(broken) in str(err.value)
    (tmp_path / "val" / "bird").mkdir()
    with pytest.raises(DataFormatError, match="class 'bird' is not among the 2 classes") as err:
        load_images(tmp_path, image_size=8)
    assert str(tmp_path / "val" / "bird") in str(err.value)
    (tmp_path / "val" / "bird").rmdir()
    (tmp_path / "train" / "fish").mkdir()
    with pytest.raises(DataFormatError, match="holds no image") as err:
        load_images(tmp_path, image_size=8)
    assert str(tmp_path / "train" / "fish") in str(err.value)


def test_missing_pillow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"pip install 'kattn\[vision\]'"):
        load_images(tmp_path, image_size=8)
