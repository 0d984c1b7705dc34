"""LRA Pathfinder's image generator: two circular markers, joined or not by a dashed contour.

:func:`generate_pathfinder` writes the released layout (see :mod:`kattn.data.pathfinder`, whose
:func:`~kattn.data.pathfinder.load_pathfinder` reads it, and which re-exports this module's
public names); :func:`draw_pathfinder` draws one image.

**kattn's generator** follows Linsley et al. 2018 ("Learning long-range spatial dependencies
with horizontal gated recurrent units") and the 32-pixel settings of LRA's builder
(paddle length 2, thickness 0.5, margin 1, marker radius 1.5, continuity 1.0, distractors of
``contour_length // 3`` paddles, ``20 // distractor_length`` of them), without being
pixel-identical to their ``snakes2`` code. Per image (coordinates in pixels):

1. A contour is a chain of paddles: segments of ``PADDLE_LENGTH``, ``PADDLE_MARGIN`` apart,
   each turned from its neighbour by an angle uniform in ±``CONTINUITY``·45°. It grows from a
   random seed paddle, one paddle at a random end at a time (without rejections, the same
   chains as growing at one end, with fewer dead ends at the border), inside
   ``[1, S - 1]²``; a paddle is redrawn up to ``_TRIES`` times, then the contour restarts
   (``_TRIES`` starts).
2. Two targets of ``contour_length`` paddles. Markers (disks of ``MARKER_RADIUS``) go on both
   tips of the first (label 1), or on one random tip of each (label 0), each drawn as soon as
   its target is. If a target or marker finds no room, the image restarts.
3. The distractors; one that finds no room is left out (at length 14 about 3 of the
   nominal 5 fit, at 6 and 9 most).
4. Strokes are white (255) within ``PADDLE_THICKNESS / 2`` of their axis and fall off
   linearly to 0 over ``_ANTIALIAS``; the image is their pixel-wise maximum. No single-paddle
   filler distractors and one contrast (``n_paddle_contrasts = 1``).

A stroke is kept only if its lit pixels (value > 0) are not 8-adjacent to those of another
contour, and a paddle may not light a pixel of its own contour's older paddles. So the lit
pixels of two contours are never 8-connected, while each contour's are (every stroke lights
all pixel centres within 1.25 of its axis, which bridges the 1 px gaps): the markers are
8-connected through lit pixels iff label = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

#: level folder of each contour length (in paddles).
LEVELS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}

PADDLE_LENGTH = 2
PADDLE_THICKNESS = 0.5
PADDLE_MARGIN = 1
MARKER_RADIUS = 1.5
#: the largest turn between consecutive paddles, in units of 45°.
CONTINUITY = 1.0
N_PADDLE_CONTRASTS = 1
_ANTIALIAS = 1.0
_TRIES = 8  # starts per contour, turns per paddle
_IMAGE_TRIES = 100

Array = npt.NDArray[Any]


@dataclass
class PathfinderImage:
    """One generated image and what made it.

    Attributes:
        pixels: ``(S, S)`` uint8 intensities.
        label: 1 when both markers lie on the same contour, else 0.
        markers: the two marker centres ``(x, y)`` in pixels; pixel ``(r, c)`` covers
            ``[c, c + 1) × [r, r + 1)``.
        contours: each contour's ``(n, 2, 2)`` paddle end points ``(x, y)``; the two targets
            first, then the distractors.
    """

    pixels: Array
    label: int
    markers: tuple[tuple[float, float], tuple[float, float]]
    contours: list[Array] = field(default_factory=list)


def draw_pathfinder(
    rng: np.random.Generator, *, label: int, contour_length: int = 14, image_size: int = 32
) -> PathfinderImage:
    """Draw one Pathfinder image with ``rng`` (the procedure of the module docstring).

    Args:
        rng: the only source of randomness.
        label: 1 to put both markers on one contour, 0 to put them on different ones.
        contour_length: paddles per target contour.
        image_size: S, the image side in pixels.

    Returns:
        The ``(S, S)`` uint8 image, its label, marker centres and contours.

    Raises:
        ValueError: ``label`` is not 0 or 1, ``contour_length < 1`` or ``image_size < 16``.
        RuntimeError: the targets found no room in ``_IMAGE_TRIES`` tries.
    """
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    if contour_length < 1 or image_size < 16:
        raise ValueError(
            f"need contour_length >= 1 and image_size >= 16, got {contour_length} and {image_size}"
        )
    distractor_length = max(contour_length // 3, 1)
    for _ in range(_IMAGE_TRIES):
        canvas, targets, markers = _Canvas(image_size), [], []
        for k in (0, 1):
            contour = canvas.grow(rng, k, contour_length)
            if contour is None:
                break
            targets.append(contour)
            need = (2 - 2 * k) if label else 1  # markers on this target
            for tip in (contour[0, 0], contour[-1, 1])[:: 1 if rng.integers(2) else -1]:
                if need and canvas.place(k, tip, tip, MARKER_RADIUS):
                    markers.append((float(tip[0]), float(tip[1])))
                    need -= 1
            if need:
                break
        else:
            distractors = [
                canvas.grow(rng, 2 + i, distractor_length) for i in range(20 // distractor_length)
            ]
            contours = targets + [d for d in distractors if d is not None]
            return PathfinderImage(canvas.pixels, label, (markers[0], markers[1]), contours)
    raise RuntimeError(
        f"could not place two contours of {contour_length} paddles in a {image_size}×"
        f"{image_size} image in {_IMAGE_TRIES} tries; use a larger image or shorter contours"
    )


class _Canvas:
    """The image, and which contour owns each lit pixel (-1: none)."""

    def __init__(self, size: int) -> None:
        self.x, self.y = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5)  # (S, S)
        self.owner = np.full((size, size), -1, dtype=np.int16)
        self.pixels = np.zeros((size, size), dtype=np.uint8)
        self.size = size

    def distance(self, a: Array, b: Array) -> Array:
        """``(S, S)`` distance of each pixel centre to the segment a→b (a point if a = b)."""
        (ax, ay), (dx, dy) = a, b - a
        px, py = self.x - ax, self.y - ay
        t = np.clip((px * dx + py * dy) / max(dx * dx + dy * dy, 1e-12), 0.0, 1.0)
        return np.hypot(px - t * dx, py - t * dy)

    def forbidden(self, k: int) -> Array:
        """Pixels equal or 8-adjacent to a lit pixel of another contour than k."""
        other = np.pad((self.owner >= 0) & (self.owner != k), 1)
        n = self.size
        return np.any([other[i : i + n, j : j + n] for i in range(3) for j in range(3)], 0)

    def commit(self, k: int, dist: Array, half_width: float) -> None:
        """Draw a stroke: value 1 within ``half_width``, falling to 0 over ``_ANTIALIAS``."""
        lit = dist < half_width + _ANTIALIAS  # the one definition of a stroke's pixels
        value = np.ceil(255.0 * (1.0 - (dist - half_width) / _ANTIALIAS))
        self.owner[lit] = k
        np.maximum(
            self.pixels, np.where(lit, np.clip(value, 1, 255), 0), out=self.pixels, casting="unsafe"
        )

    def place(self, k: int, a: Array, b: Array, half_width: float) -> bool:
        dist = self.distance(a, b)
        if np.any((dist < half_width + _ANTIALIAS) & self.forbidden(k)):
            return False
        self.commit(k, dist, half_width)
        return True

    def grow(self, rng: np.random.Generator, k: int, n: int) -> Array | None:
        """Contour k of n paddles as ``(n, 2, 2)`` end points in chain order, or None.

        A seed paddle is extended at a random end, one paddle at a time: growing at both ends
        draws the same chains as growing at one, and fails less often at the image border.
        """
        forbidden, reach = self.forbidden(k), PADDLE_THICKNESS / 2 + _ANTIALIAS
        for _ in range(_TRIES):
            chain: list[tuple[Array, Array, float, Array]] = []  # (a, b, heading, distance)
            while len(chain) < n:
                for end in ((1, 0) if rng.integers(2) else (0, 1)) if chain else (1,):
                    others = chain[:-1] if end else chain[1:]  # all but the neighbour
                    blocked = np.any([forbidden] + [c[3] < reach for c in others], axis=0)
                    found = self._paddle(rng, chain, end, blocked, reach)
                    if found is not None:
                        chain.insert(len(chain) if end else 0, found)
                        break
                else:
                    break
            if len(chain) == n:
                for *_, dist in chain:
                    self.commit(k, dist, PADDLE_THICKNESS / 2)
                return np.array([(a, b) for a, b, *_ in chain])
        return None

    def _paddle(
        self, rng: np.random.Generator, chain: list[Any], end: int, blocked: Array, reach: float
    ) -> tuple[Array, Array, float, Array] | None:
        """A paddle after the chain's head (end 1) or before its tail (end 0) that lights no
        blocked pixel, a random seed paddle if the chain is empty; None after ``_TRIES``."""
        lo, hi, turn = 1.0, self.size - 1.0, CONTINUITY * math.pi / 4
        for _ in range(_TRIES if chain else 1):
            if not chain:
                heading, a = rng.uniform(0, 2 * math.pi), rng.uniform(lo, hi, 2)
                b = tip = a + PADDLE_LENGTH * _unit(heading)
            elif end:
                heading = chain[-1][2] + rng.uniform(-turn, turn)
                a = chain[-1][1] + PADDLE_MARGIN * _unit(heading)
                b = tip = a + PADDLE_LENGTH * _unit(heading)
            else:
                heading = chain[0][2] + rng.uniform(-turn, turn)
                b = chain[0][0] - PADDLE_MARGIN * _unit(heading)
                a = tip = b - PADDLE_LENGTH * _unit(heading)
            if min(*a, *b) < lo or max(*a, *b) > hi or blocked[int(tip[1]), int(tip[0])]:
                continue  # the tip's own pixel would be lit: a cheap early test
            dist = self.distance(a, b)
            if not np.any((dist < reach) & blocked):
                return a, b, heading, dist
        return None


def _unit(angle: float) -> Array:
    return np.array([math.cos(angle), math.sin(angle)])


def generate_pathfinder(
    out_dir: str | PathLike[str],
    *,
    count: int,
    contour_length: int = 14,
    image_size: int = 32,
    batch_size: int = 1000,
    seed: int = 0,
    level: str | None = None,
) -> Path:
    """Write ``count`` Pathfinder images in the released layout and return the level folder.

    Labels are balanced (``count // 2`` of label 1, shuffled by ``seed``); image ``j`` is
    ``draw_pathfinder(np.random.default_rng([seed, j]), ...)``, saved as
    ``<out_dir>/<level>/imgs/<j // batch_size>/sample_<j % batch_size>.png`` with its line in
    ``<out_dir>/<level>/metadata/<j // batch_size>.npy`` (text, as released).

    Args:
        out_dir: the ``pathfinder32`` folder to write into.
        count: the number of images.
        contour_length: paddles per target contour (6, 9 and 14 are LRA's levels).
        image_size: S, the image side in pixels.
        batch_size: images per ``imgs/<batch>`` folder and metadata file.
        seed: makes the output reproducible.
        level: the level folder; default the name of ``contour_length``'s level.

    Raises:
        ValueError: ``count`` or ``batch_size`` below 1, or no ``level`` for a contour length
            other than 6, 9 and 14.
        ImportError: Pillow is not installed.
    """
    if count < 1 or batch_size < 1:
        raise ValueError(f"count and batch_size must be >= 1, got {count} and {batch_size}")
    if level is None and contour_length not in LEVELS:
        raise ValueError(
            f"contour_length {contour_length} has no released level "
            f"({sorted(LEVELS)}); pass level= to name its folder"
        )
    image = _pil()
    root = Path(out_dir) / (level or LEVELS[contour_length])
    labels = np.random.default_rng(seed).permutation(np.arange(count) % 2)
    columns = (
        f"{CONTINUITY} {contour_length} {max(contour_length // 3, 1)} {PADDLE_LENGTH} "
        f"{PADDLE_THICKNESS} {PADDLE_MARGIN} {N_PADDLE_CONTRASTS}"
    )
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    for batch in range(math.ceil(count / batch_size)):
        folder = root / "imgs" / str(batch)
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(min(batch_size, count - batch * batch_size)):
            j = batch * batch_size + i
            rng = np.random.default_rng([seed, j])
            drawn = draw_pathfinder(
                rng, label=int(labels[j]), contour_length=contour_length, image_size=image_size
            )
            image.fromarray(drawn.pixels).save(folder / f"sample_{i}.png")
            lines.append(f"imgs/{batch} sample_{i}.png {i} {drawn.label} {columns}\n")
        (root / "metadata" / f"{batch}.npy").write_text("".join(lines))
    return root


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            'Pathfinder reads and writes PNGs with Pillow: pip install "kattn[data]"'
        ) from err
    return Image
