"""Image (CIFAR-10) loader on tiny batches in the released layout: greyscale ids of known
pixels, splits, the black-pixel padding convention, error messages; compact id storage."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.data.base import DataFormatError, SequenceDataset
from kattn.data.image import load_image, rgb_to_grayscale


def cifar_row(pixels: dict[int, tuple[int, int, int]], fill: int = 0) -> np.ndarray:
    """One CIFAR row: R, G and B planes of 1024 row-major pixels; ``pixels`` maps a flat
    position row*32+col to its (r, g, b), the rest are (fill, fill, fill)."""
    data = np.full((3, 1024), fill, dtype=np.uint8)
    for position, rgb in pixels.items():
        data[:, position] = rgb
    return data.reshape(3072)


def write_cifar(root: Path, per_batch: int = 4, test_size: int = 3) -> Path:
    """Five train batches and a test batch; image k of the train set has label k % 10 and
    every pixel (k, k, k) except pixel 0."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    k = 0
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = test_size if name == "test_batch" else per_batch
        rows, labels = [], []
        for _ in range(n):
            rows.append(cifar_row({0: (200, 0, 0), 34: (10, 20, 30)}, fill=k % 256))
            labels.append(k % 10)
            k += 1
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": np.stack(rows),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        with (folder / name).open("wb") as file:
            # protocol 2 as the released py2 pickles; one batch in today's default protocol
            pickle.dump(batch, file, protocol=None if name == "data_batch_3" else 2)
    (folder / "batches.meta").write_bytes(b"not read")
    return folder


def test_grayscale_known_pixels() -> None:
    pixels = {0: (0, 0, 0), 1: (255, 255, 255), 2: (200, 0, 0), 3: (0, 0, 255), 4: (10, 20, 30)}
    gray = rgb_to_grayscale(cifar_row(pixels)[None])
    assert gray.shape == (1, 1024) and gray.dtype == np.uint8
    # 255.5·(0.2989·200/255) = 59.897 → 59 (TF truncates after ·255.5; rounding 255·g gives 60)
    # 255.5·0.9999 = 255.47 → 255; 255.5·0.1140 = 29.13 → 29;
    # 255.5·(0.2989·10 + 0.5870·20 + 0.1140·30)/255 = 255.5·18.149/255 = 18.18 → 18
    assert gray[0, :5].tolist() == [0, 255, 59, 29, 18]


def test_grayscale_matches_float64_formula_away_from_ties() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(64, 3072), dtype=np.uint8)
    rgb = data.reshape(64, 3, 1024).astype(np.float64) / 255
    exact = 255.5 * np.tensordot(np.array([0.2989, 0.5870, 0.1140]), rgb, axes=([0], [1]))
    clear = np.abs(exact - np.round(exact)) > 1e-3  # not within float32 rounding of an integer
    assert clear.mean() > 0.99
    gray = rgb_to_grayscale(data).astype(np.int64)
    assert np.array_equal(gray[clear], np.floor(exact[clear]).astype(np.int64))


def test_image_splits_tokens_and_labels(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    task = load_image(tmp_path)
    assert (task.task, task.vocab_size, task.num_classes, task.max_len) == ("image", 256, 10, 1024)
    # 20 train images: train[:90%] = 18, train[90%:] = 2; test_batch = 3
    assert (len(task.train), len(task.valid), len(task.test)) == (18, 2, 3)
    assert task.train.labels.tolist() == [k % 10 for k in range(18)]
    assert task.valid.labels.tolist() == [8, 9]  # the last images of data_batch_5
    assert task.test.labels.tolist() == [0, 1, 2]  # images 20, 21, 22
    tokens = task.train.tokens
    assert tokens.shape == (18, 1024) and tokens.dtype == torch.int16
    assert tokens[:, 0].tolist() == [59] * 18  # pixel (0, 0) is (200, 0, 0)
    assert tokens[:, 34].tolist() == [18] * 18  # pixel (row 1, col 2) is (10, 20, 30)
    # a grey pixel (k, k, k) becomes ⌊255.5·0.9999·k/255⌋: k for these k
    assert tokens[5, 1:34].unique().tolist() == [5]
    assert tokens[17, 35:].unique().tolist() == [17]
    assert task.valid.tokens[1, 100].item() == 19
    assert task.train.lengths.tolist() == [1024] * 18


def test_image_black_pixels_are_id_zero(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    task = load_image(tmp_path / "cifar-10-batches-py", valid_fraction=0.5)
    assert (len(task.train), len(task.valid)) == (10, 10)
    image0 = task.train[0]  # filled with (0, 0, 0) apart from pixels 0 and 34
    tokens, lengths = image0["tokens"][None], image0["lengths"][None]
    by_id = SequenceDataset.padding_mask(tokens, lengths, pad_id_mask=True)
    by_length = SequenceDataset.padding_mask(tokens, lengths, pad_id_mask=False)
    assert int(by_id.sum()) == 1022  # LRA's convention masks the black pixels
    assert not by_length.any()


def test_image_bad_valid_fraction(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="valid_fraction"):
            load_image(tmp_path, valid_fraction=fraction)


def test_image_missing_folder_and_batch(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no CIFAR-10 batches found") as err:
        load_image(tmp_path)
    assert str(tmp_path / "cifar-10-batches-py") in str(err.value)
    folder = write_cifar(tmp_path)
    (folder / "data_batch_4").unlink()
    with pytest.raises(DataFormatError, match="is missing") as err:
        load_image(tmp_path)
    assert str(folder / "data_batch_4") in str(err.value)


def rewrite(path: Path, batch: object) -> None:
    with path.open("wb") as file:
        pickle.dump(batch, file, protocol=2)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({b"data": np.zeros((2, 3072), np.uint8)}, "expected a dict with keys b'data'"),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, "expected a dict"),
        ([1, 2], "got list"),
        ({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, r"\(N, 3072\) uint8"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "dtype float32"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "1 b'labels' for 2 images"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "must be in 0-9"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": ["a", "b"]}, "not integers"),
    ],
)
def test_image_malformed_batch_names_the_file(tmp_path: Path, batch: object, message: str) -> None:
    folder = write_cifar(tmp_path)
    rewrite(folder / "data_batch_2", batch)
    with pytest.raises(DataFormatError, match=message) as err:
        load_image(tmp_path)
    assert str(folder / "data_batch_2") in str(err.value)


def test_image_refuses_foreign_pickles(tmp_path: Path) -> None:
    folder = write_cifar(tmp_path)
    rewrite(folder / "test_batch", {b"data": Path("x"), b"labels": []})  # imports pathlib
    with pytest.raises(DataFormatError, match="refusing to load pathlib") as err:
        load_image(tmp_path)
    assert str(folder / "test_batch") in str(err.value)
    (folder / "test_batch").write_bytes(b"\x80\x02}q")  # a truncated pickle
    with pytest.raises(DataFormatError, match="not a readable CIFAR-10 batch") as err:
        load_image(tmp_path)
    assert str(folder / "test_batch") in str(err.value)


def test_items_come_out_as_int64_whatever_the_storage() -> None:
    from kattn.data import SequenceDataset, pad_sequences

    tokens, lengths = pad_sequences([[5, 300], [7]], 4)
    data = SequenceDataset(tokens, lengths, torch.tensor([1, 0]))
    assert tokens.dtype == torch.int16
    item = data[0]
    assert item["tokens"].dtype == torch.int64 and item["tokens"].tolist() == [5, 300, 0, 0]
    mask = SequenceDataset.padding_mask(tokens, lengths, pad_id_mask=False)
    assert mask.tolist() == [[False, False, True, True], [False, True, True, True]]


def write_batch(path: Path, n: int) -> None:
    batch = {b"labels": [k % 10 for k in range(n)], b"data": np.zeros((n, 3072), dtype=np.uint8)}
    with path.open("wb") as file:
        pickle.dump(batch, file)


def test_image_empty_splits_are_refused_naming_split_and_file(tmp_path: Path) -> None:
    folder = write_cifar(tmp_path)
    write_batch(folder / "test_batch", 0)
    with pytest.raises(DataFormatError, match=r"test split is empty") as err:
        load_image(folder)
    assert str(folder / "test_batch") in str(err.value)
    write_batch(folder / "test_batch", 3)
    for name in ("data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"):
        write_batch(folder / name, 0)
    # 4 train images: the last 10 % rounds to none
    with pytest.raises(DataFormatError, match=r"valid split is empty: .*of 4 train images") as err:
        load_image(folder)
    assert "data_batch_1" in str(err.value)
    write_batch(folder / "data_batch_1", 0)
    with pytest.raises(DataFormatError, match=r"train split is empty") as err:
        load_image(folder)
