"""load_images on an ImageNet-style folder (train/<class>/, val/<class>/, optional test/):
classes, splits (valid a seeded hold-out of train, test test/ or val/), DeiT's resize and
centre crop, lazy decoding errors naming the file."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data import DataFormatError, ImageData, ImageSplit, load_images
from kattn.data.images_folder import FolderImageSplit

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


def names(split: ImageSplit) -> list[str]:
    """``split/class/file`` of each image of a folder's split, in its order."""
    assert isinstance(split, FolderImageSplit)
    return [f"{p.parent.parent.name}/{p.parent.name}/{p.name}" for p in split.paths]


def image_named(data: ImageData, name: str) -> torch.Tensor:
    """The image of file ``name`` from whichever of train and valid holds it."""
    for split in (data.train, data.valid):
        files = [n.rpartition("/")[2] for n in names(split)]
        if name in files:
            return split.images(torch.tensor([files.index(name)]))[0]
    raise AssertionError(f"{name} is in neither train nor valid")


def test_folder_classes_splits_and_crop(tmp_path: Path) -> None:
    pictures = write_folder(tmp_path)
    data = load_images(tmp_path, image_size=8)
    assert data.classes == ["cat", "dog"] and data.num_classes == 2
    assert (data.channels, data.size) == (3, (8, 8))
    # valid is one of the 4 train images (a tenth, at least one), never a val/ image
    train_files = ["train/cat/a.png", "train/cat/b.PNG", "train/dog/c.png", "train/dog/d.png"]
    assert len(data.valid) == 1 and sorted(names(data.train) + names(data.valid)) == train_files
    assert names(data.train) == sorted(names(data.train))  # file order kept
    labels = {name: int(name.startswith("train/dog")) for name in train_files}
    assert data.train.labels.tolist() == [labels[n] for n in names(data.train)]
    assert data.valid.labels.tolist() == [labels[n] for n in names(data.valid)]
    assert "1 of 4 train images" in data.source["valid"]
    # test is val/ (cat/f, dog/e: classes in sorted order), as there is no test/
    assert names(data.test) == ["val/cat/f.png", "val/dog/e.png"]
    assert data.test.labels.tolist() == [0, 1] and "no test/" in data.source["test"]
    assert data.source["format"] == "image-folder"
    assert data.source["sizes"] == {"train": 3, "valid": 1, "test": 2}
    assert json.loads(json.dumps(data.source)) == data.source
    images = data.train.images(torch.arange(3))
    assert images.shape == (3, 3, 8, 8) and images.dtype == torch.uint8
    # 9×9 at image_size 8: the shorter side is already int(8 / 0.875) = 9, so no resize, and
    # the centre crop starts at round((9 − 8) / 2) = 0
    expected = torch.from_numpy(pictures["train/cat/a.png"][:8, :8]).permute(2, 0, 1)
    assert torch.equal(image_named(data, "a.png"), expected)
    grey = torch.from_numpy(pictures["train/dog/d.png"][:8, :8])
    assert torch.equal(image_named(data, "d.png"), grey.expand(3, 8, 8))  # greyscale made RGB


def test_folder_valid_is_a_seeded_holdout_of_train(tmp_path: Path) -> None:
    write_folder(tmp_path)
    for k in range(16):  # 20 train images: valid holds out 2
        put = tmp_path / "train" / ("cat" if k % 2 else "dog") / f"x{k:02d}.png"
        Image.fromarray(pattern(9, 9, 10 + k)).save(put)
    data = load_images(tmp_path, image_size=8, seed=3)
    assert (len(data.train), len(data.valid)) == (18, 2)
    assert not set(names(data.valid)) & set(names(data.train))
    assert all(name.startswith("train/") for name in names(data.valid))
    again = load_images(tmp_path, image_size=8, seed=3)
    assert names(again.valid) == names(data.valid)
    others = {tuple(names(load_images(tmp_path, image_size=8, seed=s).valid)) for s in range(4, 9)}
    assert others - {tuple(names(data.valid))}  # another seed holds out other images
    assert "numpy default_rng(3)" in data.source["valid"]


def test_folder_with_too_few_train_images(tmp_path: Path) -> None:
    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        Image.fromarray(pattern(9, 9, 0)).save(tmp_path / split / "cat" / "a.png")
    with pytest.raises(DataFormatError, match=r"holds 1 image.*leaves no training image"):
        load_images(tmp_path, image_size=8)


def test_folder_resize_keeps_the_aspect_and_crops_the_centre(tmp_path: Path) -> None:
    write_folder(tmp_path)
    picture = np.zeros((12, 18, 3), dtype=np.uint8)
    picture[:, :9] = (255, 0, 0)  # left half red, right half blue
    picture[:, 9:] = (0, 0, 255)
    Image.fromarray(picture).save(tmp_path / "train" / "dog" / "c.png")
    image = image_named(load_images(tmp_path, image_size=8), "c.png")
    # 18×12 → 13×9 (shorter side 9), crop columns 2..9: red on the left, blue on the right
    assert image[0, :, 0].tolist() == [255] * 8 and image[2, :, 0].tolist() == [0] * 8
    assert image[0, :, -1].tolist() == [0] * 8 and image[2, :, -1].tolist() == [255] * 8


def test_deit_resize_truncates(tmp_path: Path) -> None:
    """At 32 the shorter side is int(32 / 0.875) = 36 (DeiT), not round(...) = 37: a 36×48
    picture is only centre-cropped, rows 8..39 and columns 2..33."""
    write_folder(tmp_path)
    picture = pattern(48, 36, 9)
    Image.fromarray(picture).save(tmp_path / "train" / "dog" / "c.png")
    data = load_images(tmp_path, image_size=32)
    expected = torch.from_numpy(picture[8:40, 2:34]).permute(2, 0, 1)
    assert torch.equal(image_named(data, "c.png"), expected)
    assert data.source["resize"].startswith("shorter side to 36 = int(32 / 0.875)")


def test_folder_test_split(tmp_path: Path) -> None:
    write_folder(tmp_path, test=True)
    (tmp_path / "val" / "bird").mkdir()  # val/ is not read when test/ is there
    data = load_images(tmp_path, image_size=8)
    assert names(data.test) == ["test/dog/g.png"] and data.test.labels.tolist() == [1]
    assert data.source["test"] == "test/" and len(data.train) + len(data.valid) == 4
    shutil.rmtree(tmp_path / "val")
    assert names(load_images(tmp_path, image_size=8).test) == ["test/dog/g.png"]
    shutil.rmtree(tmp_path / "test")
    with pytest.raises(DataFormatError, match="has neither test/ nor val/"):
        load_images(tmp_path, image_size=8)


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
        image_named(data, "b.PNG")
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


def test_a_decompression_bomb_is_a_format_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_folder(tmp_path)
    data = load_images(tmp_path, image_size=8)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # 9×9 = 81 > 2·20: Pillow refuses
    with pytest.raises(DataFormatError, match="DecompressionBombError") as err:
        image_named(data, "a.png")
    assert str(tmp_path / "train" / "cat" / "a.png") in str(err.value)


def test_missing_pillow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"pip install 'kattn\[vision\]'"):
        load_images(tmp_path, image_size=8)
