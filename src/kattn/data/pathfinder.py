"""LRA Pathfinder: are the two circular markers joined by one dashed contour?

**Released data** (implementation notes §D.1–D.2). ``pathfinder32/<level>/imgs/<batch>/
sample_<i>.png`` are 32×32 greyscale PNGs and ``<level>/metadata/<batch>.npy`` are *text*
files, one line per image: ``imgs/<batch> sample_<i>.png <i> <label> <continuity>
<contour_length> <distractor_length> <paddle_length> <paddle_thickness> <paddle_margin>
<n_paddle_contrasts>``. The levels ``curv_baseline``, ``curv_contour_length_9`` and
``curv_contour_length_14`` have contours of 6, 9 and 14 paddles; LRA's "Pathfinder" is
``curv_contour_length_14``. Each image is flattened row-major to 1024 tokens of pixel
intensity 0–255 (vocabulary 256, 2 classes); id 0 is a black pixel, not padding, so every
length is 1024. LRA's base config splits in file order: the first 80 % train, the next 10 %
valid, the last 10 % test. The release holds one empty PNG, which is skipped.

**kattn's generator** (:func:`generate_pathfinder`, :func:`draw_pathfinder`) is in
:mod:`kattn.data.pathfinder_generator`, which describes its procedure; it is re-exported here.
"""

from __future__ import annotations

import itertools
import math
import warnings
from os import PathLike
from pathlib import Path

import numpy as np

from .base import DataFormatError, TaskData, pixel_dataset
from .pathfinder_generator import (
    CONTINUITY,
    LEVELS,
    MARKER_RADIUS,
    N_PADDLE_CONTRASTS,
    PADDLE_LENGTH,
    PADDLE_MARGIN,
    PADDLE_THICKNESS,
    Array,
    PathfinderImage,
    _pil,
    draw_pathfinder,
    generate_pathfinder,
)

__all__ = [
    "CONTINUITY",
    "LEVELS",
    "MARKER_RADIUS",
    "N_PADDLE_CONTRASTS",
    "PADDLE_LENGTH",
    "PADDLE_MARGIN",
    "PADDLE_THICKNESS",
    "Array",
    "PathfinderImage",
    "draw_pathfinder",
    "generate_pathfinder",
    "load_pathfinder",
]


def load_pathfinder(
    data_dir: str | PathLike[str],
    *,
    level: str = "curv_contour_length_14",
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> TaskData:
    """Load a Pathfinder level: every metadata file in batch order, its PNGs as pixel ids.

    Args:
        data_dir: ``pathfinder32`` (a folder holding ``<level>/``), its parent, or the level
            folder itself.
        level: ``curv_baseline``, ``curv_contour_length_9`` or ``curv_contour_length_14``.
        split: train, valid and test fractions, taken in file order (LRA: 80/10/10); the
            boundaries are rounded to the closest image.

    Returns:
        Tokens ``(N, S²)``: row-major intensities 0–255 (0 is a black pixel, which LRA's
        ``pad_id_mask=True`` masks), lengths all S², vocabulary 256, 2 classes. Empty or
        undecodable PNGs are skipped with a warning and listed in ``info["skipped"]``.

    Raises:
        DataFormatError: the level folder, its metadata, or an image a metadata line names is
            missing; a metadata line is malformed; an image is not S×S like the first one; a
            split with a positive share would get no image.
        ValueError: ``split`` is not three non-negative fractions summing to 1.
        ImportError: Pillow is not installed.
    """
    if len(split) != 3 or min(split) < 0 or not math.isclose(sum(split), 1.0):
        raise ValueError(f"split must be 3 non-negative fractions summing to 1, got {split!r}")
    root = _find_level(Path(data_dir), level)
    meta = sorted((root / "metadata").glob("*.npy"), key=_batch_order)
    if not meta:
        raise DataFormatError(f"{root / 'metadata'} holds no <batch>.npy metadata files")
    image = _pil()
    pixels: list[Array] = []
    labels: list[int] = []
    skipped: list[str] = []
    for file in meta:
        for number, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            path, label = _parse(file, number, line)
            if not (root / path).is_file():
                raise DataFormatError(f"{file}, line {number}: names {root / path}, missing")
            try:
                with image.open(root / path) as png:
                    data = np.asarray(png if png.mode == "L" else png.convert("L"))
            except (OSError, SyntaxError, ValueError):  # empty or corrupt file
                skipped.append(str(root / path))
                continue
            if data.shape != (data.shape[0],) * 2 or (pixels and data.size != pixels[0].size):
                raise DataFormatError(
                    f"{root / path} ({file}, line {number}) is "
                    f"{data.shape}, expected square images of one size"
                )
            pixels.append(data.reshape(-1))
            labels.append(label)
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} empty or unreadable image(s): {', '.join(skipped[:5])}",
            stacklevel=2,
        )
    if not pixels:
        raise DataFormatError(f"{root}: the metadata lists no readable image")
    tokens, targets, n = np.stack(pixels), np.asarray(labels, dtype=np.int64), len(labels)
    cuts = [0, round(n * split[0]), round(n * (split[0] + split[1])), n]
    for name, share, start, end in zip(
        ("train", "valid", "test"), split, cuts[:-1], cuts[1:], strict=True
    ):
        if share > 0 and start == end:
            raise DataFormatError(
                f"the {name} split is empty: {root / 'metadata'} lists {n} readable images, "
                f"and its {share:.0%} of them rounds to none; give more images (or a split "
                f"without it)"
            )
    parts = [pixel_dataset(tokens[a:b], targets[a:b]) for a, b in itertools.pairwise(cuts)]
    return TaskData(
        task="pathfinder",
        train=parts[0],
        valid=parts[1],
        test=parts[2],
        vocab_size=256,
        num_classes=2,
        max_len=tokens.shape[1],
        info={
            "source": str(root),
            "level": level,
            "metadata_files": len(meta),
            "images": n,
            "skipped": skipped,
            "num_skipped": len(skipped),
            "tokenisation": "PNG intensities 0-255, row-major; 0 is a black pixel",
            "split": f"file order: train [0, {cuts[1]}), valid [{cuts[1]}, {cuts[2]}), "
            f"test [{cuts[2]}, {n})",
        },
    )


def _find_level(data_dir: Path, level: str) -> Path:
    candidates = (data_dir / level, data_dir / "pathfinder32" / level, data_dir)
    for folder in candidates:
        if folder.name == level and folder.is_dir():
            return folder
    raise DataFormatError(
        f"no Pathfinder level folder {level!r}: looked for {candidates[0]} and "
        f"{candidates[1]}; expected <pathfinder32>/{level}/{{imgs,metadata}}"
    )


def _batch_order(path: Path) -> tuple[int, str]:
    return (int(path.stem), "") if path.stem.isdigit() else (2**63, path.stem)


def _parse(file: Path, number: int, line: str) -> tuple[str, int]:
    fields = line.split()
    if len(fields) != 11 or not fields[0].startswith("imgs/") or fields[3] not in ("0", "1"):
        raise DataFormatError(
            f"{file}, line {number}: expected 11 space-separated columns 'imgs/<batch> "
            f"sample_<i>.png <i> <label 0/1> <continuity> <contour_length> "
            f"<distractor_length> <paddle_length> <paddle_thickness> <paddle_margin> "
            f"<n_paddle_contrasts>', got {line!r}"
        )
    return f"{fields[0]}/{fields[1]}", int(fields[3])
