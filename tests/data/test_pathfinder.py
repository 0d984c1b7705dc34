"""Pathfinder generator and loader: seeded output, the released layout and metadata, balanced
labels, marker connectivity through lit pixels, the loader's ids, skipped files and errors."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kattn.data.base import DataFormatError
from kattn.data.pathfinder import (
    LEVELS,
    PADDLE_LENGTH,
    PADDLE_MARGIN,
    draw_pathfinder,
    generate_pathfinder,
    load_pathfinder,
)

LEVEL_14 = "curv_contour_length_14"


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def metadata_rows(root: Path) -> list[list[str]]:
    paths = sorted((root / "metadata").glob("*.npy"), key=lambda p: int(p.stem))
    return [line.split() for p in paths for line in p.read_text().splitlines()]


def pixel(point: tuple[float, float]) -> tuple[int, int]:
    """The (row, column) of the pixel holding the point (x, y)."""
    return int(point[1]), int(point[0])


def component(lit: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """The 8-connected component of ``start`` among the True pixels of ``lit``."""
    seen = np.zeros_like(lit, dtype=bool)
    stack = [start]
    while stack:
        r, c = stack.pop()
        if 0 <= r < lit.shape[0] and 0 <= c < lit.shape[1] and lit[r, c] and not seen[r, c]:
            seen[r, c] = True
            stack += [(r + i, c + j) for i in (-1, 0, 1) for j in (-1, 0, 1)]
    return seen


def test_generation_is_reproducible_by_seed(tmp_path: Path) -> None:
    first = generate_pathfinder(tmp_path / "a", count=12, batch_size=5, seed=3)
    again = generate_pathfinder(tmp_path / "b", count=12, batch_size=5, seed=3)
    other = generate_pathfinder(tmp_path / "c", count=12, batch_size=5, seed=4)
    assert files(first) == files(again)
    assert files(first).keys() == files(other).keys()
    assert files(first) != files(other)


@pytest.mark.parametrize("length", [6, 9, 14], ids=lambda n: f"contour{n}")
def test_layout_and_metadata_columns_as_released(tmp_path: Path, length: int) -> None:
    root = generate_pathfinder(tmp_path, count=7, contour_length=length, batch_size=3, seed=1)
    assert root == tmp_path / LEVELS[length]
    expected = {f"metadata/{b}.npy" for b in range(3)}
    expected |= {f"imgs/{j // 3}/sample_{j % 3}.png" for j in range(7)}
    assert set(files(root)) == expected
    assert not (root / "metadata/0.npy").read_bytes().startswith(b"\x93NUMPY")  # text
    rows = metadata_rows(root)
    assert len(rows) == 7
    for j, row in enumerate(rows):
        assert len(row) == 11
        assert row[:3] == [f"imgs/{j // 3}", f"sample_{j % 3}.png", str(j % 3)]
        assert row[3] in ("0", "1")
        assert int(row[5]) == length
        assert int(row[6]) == length // 3
        assert float(row[7]) == PADDLE_LENGTH and float(row[9]) == PADDLE_MARGIN
        with Image.open(root / row[0] / row[1]) as png:
            assert (png.mode, png.size) == ("L", (32, 32))


def test_level_name_is_required_for_other_lengths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass level="):
        generate_pathfinder(tmp_path, count=2, contour_length=7)
    root = generate_pathfinder(tmp_path, count=2, contour_length=7, level="curv_7")
    assert [int(row[5]) for row in metadata_rows(root)] == [7, 7]


@pytest.mark.parametrize("count", [20, 21])
def test_labels_are_balanced(tmp_path: Path, count: int) -> None:
    root = generate_pathfinder(tmp_path, count=count, contour_length=6, seed=5)
    labels = [int(row[3]) for row in metadata_rows(root)]
    assert sorted(labels) == sorted(np.arange(count) % 2)
    assert labels != sorted(labels)  # shuffled, not sorted


@pytest.mark.parametrize("length", [6, 9, 14], ids=lambda n: f"contour{n}")
def test_markers_are_joined_by_lit_pixels_iff_label_1(length: int) -> None:
    # A pixel check, exact by construction: lit pixels of two contours are never 8-adjacent.
    for seed in range(40):
        drawn = draw_pathfinder(np.random.default_rng(seed), label=seed % 2, contour_length=length)
        lit = drawn.pixels > 0
        start, goal = (pixel(m) for m in drawn.markers)
        assert drawn.pixels[start] == 255 and drawn.pixels[goal] == 255
        assert component(lit, start)[goal] == bool(drawn.label), f"seed {seed}"


@pytest.mark.parametrize("label", [0, 1])
def test_contour_structure(label: int) -> None:
    for seed in range(10):
        drawn = draw_pathfinder(np.random.default_rng(seed), label=label, contour_length=14)
        assert [len(c) for c in drawn.contours[:2]] == [14, 14]
        assert all(len(c) == 4 for c in drawn.contours[2:]) and len(drawn.contours) <= 2 + 5
        for contour in drawn.contours:
            step = contour[:, 1] - contour[:, 0]
            np.testing.assert_allclose(np.linalg.norm(step, axis=1), PADDLE_LENGTH)
            gaps = np.linalg.norm(contour[1:, 0] - contour[:-1, 1], axis=1)
            np.testing.assert_allclose(gaps, PADDLE_MARGIN)
            heading = np.arctan2(step[:, 1], step[:, 0])
            turns = np.angle(np.exp(1j * np.diff(heading)))
            assert np.all(np.abs(turns) <= math.pi / 4 + 1e-9)
            assert contour.min() >= 1 and contour.max() <= 31
        tips = [{tuple(c[0, 0]), tuple(c[-1, 1])} for c in drawn.contours[:2]]
        on = [sum(m in t for m in drawn.markers) for t in tips]
        assert on == ([2, 0] if label else [1, 1])


def test_files_hold_the_drawn_images(tmp_path: Path) -> None:
    root = generate_pathfinder(tmp_path, count=6, contour_length=9, batch_size=4, seed=7)
    for j, row in enumerate(metadata_rows(root)):
        drawn = draw_pathfinder(np.random.default_rng([7, j]), label=int(row[3]), contour_length=9)
        with Image.open(root / row[0] / row[1]) as png:
            assert np.array_equal(np.asarray(png), drawn.pixels)


def test_loader_round_trip(tmp_path: Path) -> None:
    folder = tmp_path / "pathfinder32"
    root = generate_pathfinder(folder, count=40, contour_length=6, batch_size=3, seed=2)
    data = load_pathfinder(folder, level="curv_baseline")
    rows = metadata_rows(root)  # batches 0..13 in numeric order (10 after 9, not after 1)
    pixels = [np.asarray(Image.open(root / r[0] / r[1])).reshape(-1) for r in rows]
    expected = torch.from_numpy(np.stack(pixels).astype(np.int64))
    labels = torch.tensor([int(r[3]) for r in rows])
    assert (len(data.train), len(data.valid), len(data.test)) == (32, 4, 4)
    assert torch.equal(
        torch.cat([data.train.tokens, data.valid.tokens, data.test.tokens]), expected
    )
    assert torch.equal(torch.cat([data.train.labels, data.valid.labels, data.test.labels]), labels)
    assert data.train.tokens.dtype == torch.int16 and data.train[0]["tokens"].dtype == torch.int64
    assert torch.all(data.train.lengths == 1024)
    assert (data.task, data.vocab_size, data.num_classes, data.max_len) == (
        "pathfinder",
        256,
        2,
        1024,
    )
    assert data.info["num_skipped"] == 0 and data.info["metadata_files"] == 14
    for where in (tmp_path, root):  # the parent of pathfinder32, the level folder itself
        again = load_pathfinder(where, level="curv_baseline")
        assert torch.equal(again.test.tokens, data.test.tokens)


def test_empty_png_is_skipped_with_a_warning(tmp_path: Path) -> None:
    root = generate_pathfinder(tmp_path, count=10, batch_size=5, seed=0)
    full = load_pathfinder(tmp_path, split=(1.0, 0.0, 0.0))
    empty = root / "imgs/0/sample_2.png"
    empty.write_bytes(b"")
    with pytest.warns(UserWarning, match=r"skipped 1 empty or unreadable image.*sample_2\.png"):
        data = load_pathfinder(tmp_path, split=(1.0, 0.0, 0.0))
    assert data.info["num_skipped"] == 1 and data.info["skipped"] == [str(empty)]
    keep = [i for i in range(10) if i != 2]
    assert torch.equal(data.train.tokens, full.train.tokens[keep])
    assert torch.equal(data.train.labels, full.train.labels[keep])


@pytest.mark.parametrize(
    "bad",
    [
        "imgs/0 sample_1.png 1 1 1.0 14 4 2 0.5 1",  # 10 columns
        "imgs/0 sample_1.png 1 2 1.0 14 4 2 0.5 1 1",  # label 2
        "0 sample_1.png 1 1 1.0 14 4 2 0.5 1 1",  # no imgs/ prefix
    ],
    ids=["columns", "label", "path"],
)
def test_malformed_metadata_line_names_file_and_line(tmp_path: Path, bad: str) -> None:
    root = generate_pathfinder(tmp_path, count=4, batch_size=4)
    meta = root / "metadata/0.npy"
    lines = meta.read_text().splitlines()
    lines[1] = bad
    meta.write_text("\n".join(lines) + "\n")
    message = rf"{re.escape(str(meta))}, line 2: expected 11 .*{re.escape(repr(bad))}"
    with pytest.raises(DataFormatError, match=message):
        load_pathfinder(tmp_path)


def test_missing_files_raise(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match=f"no Pathfinder level folder '{LEVEL_14}'"):
        load_pathfinder(tmp_path)
    root = generate_pathfinder(tmp_path, count=3, batch_size=3)
    (root / "imgs/0/sample_1.png").unlink()
    with pytest.raises(DataFormatError, match=r"0\.npy, line 2: names .*sample_1\.png, missing"):
        load_pathfinder(tmp_path)
    (root / "metadata/0.npy").unlink()
    with pytest.raises(DataFormatError, match=r"holds no <batch>\.npy metadata"):
        load_pathfinder(tmp_path)


def test_bad_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split must be"):
        load_pathfinder(tmp_path, split=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        draw_pathfinder(np.random.default_rng(0), label=2)


def test_missing_pillow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "kattn\[data\]"'):
        generate_pathfinder(tmp_path, count=1)


def test_a_split_left_empty_by_too_few_images_is_refused(tmp_path: Path) -> None:
    root = generate_pathfinder(tmp_path, count=3, batch_size=3, seed=0)
    with pytest.raises(DataFormatError, match=r"test split is empty: .*3 readable images") as err:
        load_pathfinder(tmp_path)
    assert str(root / "metadata") in str(err.value)
    assert len(load_pathfinder(tmp_path, split=(1.0, 0.0, 0.0)).train) == 3  # asked for
