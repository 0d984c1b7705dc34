"""The embedded image set: 32×32 RGB pictures of ten simple shapes, generated, not downloaded.

One shape per image, on a plain background, with Gaussian pixel noise. The ten classes
(:data:`SHAPE_CLASSES`) differ only in their spatial arrangement:

====  ====================  ==========================================================
  id  class                 foreground pixels (``dx, dy`` from the centre, ``r`` radius)
====  ====================  ==========================================================
   0  disc                  ``dx² + dy² ≤ r²``
   1  ring                  ``r − w ≤ √(dx² + dy²) ≤ r``
   2  square                ``max(|dx|, |dy|) ≤ r``
   3  square outline        ``r − w ≤ max(|dx|, |dy|) ≤ r``
   4  triangle              apex up or down (random), base ``2r``, height ``2r``
   5  plus                  two bars of width ``w`` and length ``2r``, upright
   6  cross                 the two diagonals of the ``2r`` square, width ``w``
   7  horizontal stripes    rows of the ``2r`` square in bands of ``p`` pixels, every other
   8  vertical stripes      the same with columns
   9  checkerboard          cells of ``p × p`` in the ``2r`` square, every other
====  ====================  ==========================================================

Per image: radius ``r`` uniform in ``[min_radius, max_radius]``, centre uniform where the
shape fits one pixel inside the border, stroke width ``w`` uniform in
``[min_width, max_width]``, band ``p`` 2 or 3 pixels. Foreground and background colours are
uniform RGB, drawn independently of the class (redrawn until some channel differs by at least
``min_contrast``), so neither the mean colour nor the mean intensity tells the class. Labels
are balanced (each class ``n / 10`` times, in a random order).

:func:`embedded_images` writes the set once in CIFAR-10's python layout (``data_batch_1`` …
``_5``: 10,000 train images, ``test_batch``: 2,000, ``batches.meta``: the class names) under
``cache_dir() / "images"`` and :func:`~kattn.data.images.load_images` with no path reads it
back through the CIFAR-10 reader (valid: the last 10% of train).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .cache import cache_dir, generated_folder, parameters_key
from .images_cifar import META_FILE, TEST_FILE, TRAIN_FILES, write_cifar10

SHAPE_CLASSES = (
    "disc",
    "ring",
    "square",
    "square outline",
    "triangle",
    "plus",
    "cross",
    "horizontal stripes",
    "vertical stripes",
    "checkerboard",
)
#: bumped whenever the drawing changes, so a cached set is never stale.
EMBEDDED_IMAGES_VERSION = 1
#: the generator's parameters (train and test draw from ``default_rng([seed, 0])`` and
#: ``default_rng([seed, 1])``).
EMBEDDED_IMAGES: dict[str, Any] = {
    "num_train": 10_000,
    "num_test": 2_000,
    "image_size": 32,
    "min_radius": 5.0,
    "max_radius": 12.0,
    "min_width": 1.5,
    "max_width": 3.0,
    "min_contrast": 96,
    "noise_std": 8.0,
    "seed": 0,
}

Array = npt.NDArray[Any]
_Mask = Callable[[Array, Array, Array, Array, Array, Array], Array]


def generate_shapes(
    n: int,
    *,
    seed: int | list[int],
    image_size: int = 32,
    min_radius: float = 5.0,
    max_radius: float = 12.0,
    min_width: float = 1.5,
    max_width: float = 3.0,
    min_contrast: int = 96,
    noise_std: float = 8.0,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``n`` shape images and their classes (see the module docstring), vectorised in numpy.

    Returns:
        Images ``(n, 3, image_size, image_size)`` uint8 and labels ``(n,)`` int64 in 0–9.
    """
    if not 1 <= min_radius <= max_radius <= (image_size - 2) / 2:
        raise ValueError(
            f"radii must satisfy 1 <= min_radius <= max_radius <= (image_size - 2) / 2, got "
            f"{min_radius}, {max_radius} for image_size {image_size}"
        )
    if not 0 <= min_contrast <= 255:
        raise ValueError(f"min_contrast must be in 0-255, got {min_contrast}")
    rng = np.random.default_rng(seed)
    classes = len(SHAPE_CLASSES)
    labels = rng.permutation(np.arange(n) % classes).astype(np.int64)
    r = rng.uniform(min_radius, max_radius, n).astype(np.float32)
    cx = rng.uniform(r + 1, image_size - 1 - r).astype(np.float32)
    cy = rng.uniform(r + 1, image_size - 1 - r).astype(np.float32)
    width = rng.uniform(min_width, max_width, n).astype(np.float32)
    band = rng.integers(2, 4, n).astype(np.float32)
    down = rng.random(n) < 0.5
    fg, bg = _colours(rng, n, min_contrast)
    centres = np.arange(image_size, dtype=np.float32) + 0.5
    masks = np.zeros((n, image_size, image_size), dtype=bool)
    for k, draw in enumerate(_SHAPES):
        at = labels == k
        col = (slice(None), None, None)
        dx = centres[None, None, :] - cx[at][col]  # (n_k, 1, S)
        dy = centres[None, :, None] - cy[at][col]  # (n_k, S, 1)
        masks[at] = draw(dx, dy, r[at][col], width[at][col], band[at][col], down[at][col])
    images = np.where(masks[:, None], fg[:, :, None, None], bg[:, :, None, None])
    noisy = images + rng.normal(0.0, noise_std, images.shape).astype(np.float32)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8), labels


def embedded_images(create: bool = True) -> Path:
    """The folder of the embedded image set, generated there (once) when ``create``.

    Written to a temporary folder and renamed, so a concurrent or interrupted first use never
    leaves a half-written set behind; the temporary folder is removed when the write fails or
    another process renamed its own first. Generation takes about a second.
    """
    key = parameters_key(EMBEDDED_IMAGES)
    folder = cache_dir() / "images" / f"shapes10-v{EMBEDDED_IMAGES_VERSION}-{key}"
    if not create:
        return folder

    def write(partial: Path) -> None:
        params = {k: v for k, v in EMBEDDED_IMAGES.items() if k not in ("num_train", "num_test")}
        seed = params.pop("seed")
        train, train_labels = generate_shapes(
            EMBEDDED_IMAGES["num_train"], seed=[seed, 0], **params
        )
        test, test_labels = generate_shapes(EMBEDDED_IMAGES["num_test"], seed=[seed, 1], **params)
        write_cifar10(
            partial,
            train.reshape(len(train), -1),
            train_labels,
            test.reshape(len(test), -1),
            test_labels,
            list(SHAPE_CLASSES),
        )

    return generated_folder(folder, META_FILE, write)


def embedded_source(folder: Path) -> dict[str, Any]:
    """What a run records about the embedded set: generator, parameters, version, and the
    sha256 of each file as found in ``folder``."""
    digests = {}
    for name in (*TRAIN_FILES, TEST_FILE, META_FILE):
        digests[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    return {
        "generator": "kattn.data.image_embedded.generate_shapes",
        "parameters": dict(EMBEDDED_IMAGES),
        "version": EMBEDDED_IMAGES_VERSION,
        "classes": list(SHAPE_CLASSES),
        "sha256": digests,
    }


def _colours(rng: np.random.Generator, n: int, min_contrast: int) -> tuple[Array, Array]:
    """Foreground and background ``(n, 3)`` float32, uniform RGB, redrawn where no channel
    differs by ``min_contrast``."""
    fg = rng.integers(0, 256, (n, 3))
    bg = rng.integers(0, 256, (n, 3))
    low = np.abs(fg - bg).max(axis=1) < min_contrast
    while low.any():
        fg[low] = rng.integers(0, 256, (int(low.sum()), 3))
        bg[low] = rng.integers(0, 256, (int(low.sum()), 3))
        low = np.abs(fg - bg).max(axis=1) < min_contrast
    return fg.astype(np.float32), bg.astype(np.float32)


# Each mask takes dx (n, 1, S), dy (n, S, 1) and per-image r, w, p, down (n, 1, 1).
def _disc(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    return dx**2 + dy**2 <= r**2


def _ring(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    d = np.sqrt(dx**2 + dy**2)
    return (d <= r) & (d >= r - w)


def _square(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    return np.maximum(np.abs(dx), np.abs(dy)) <= r


def _outline(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    d = np.maximum(np.abs(dx), np.abs(dy))
    return (d <= r) & (d >= r - w)


def _triangle(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    t = np.where(down, -dy, dy)  # from the apex (t = −r) to the base (t = r)
    return (np.abs(t) <= r) & (np.abs(dx) <= (t + r) / 2)


def _plus(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    upright = (np.abs(dx) <= w / 2) & (np.abs(dy) <= r)
    return upright | ((np.abs(dy) <= w / 2) & (np.abs(dx) <= r))


def _cross(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    near = (np.abs(dx - dy) <= w / np.sqrt(2)) | (np.abs(dx + dy) <= w / np.sqrt(2))
    return near & _square(dx, dy, r, w, p, down)


def _rows(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    return (np.floor((dy + r) / p) % 2 == 0) & _square(dx, dy, r, w, p, down)


def _columns(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    return (np.floor((dx + r) / p) % 2 == 0) & _square(dx, dy, r, w, p, down)


def _checker(dx: Array, dy: Array, r: Array, w: Array, p: Array, down: Array) -> Array:
    cells = np.floor((dx + r) / p) + np.floor((dy + r) / p)
    return (cells % 2 == 0) & _square(dx, dy, r, w, p, down)


_SHAPES: tuple[_Mask, ...] = (
    _disc,
    _ring,
    _square,
    _outline,
    _triangle,
    _plus,
    _cross,
    _rows,
    _columns,
    _checker,
)
