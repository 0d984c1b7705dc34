"""What the image models share about their input: the image size, and the grid of a 2-D
relative positional encoding.

A 2-D encoding (the Swin Transformer's relative bias of Liu et al. 2021, ``rpe="toeplitz2d"``,
used by Luo et al. 2021, §4.4 and Appendix A.5) weighs each pair of tokens by their offset on an
``h × w`` grid, so the model, which knows how its tokens tile the image, sets the grid:
:class:`~kattn.nn.VisionTransformer` to the patch grid ``(H/p, W/p)``,
:class:`~kattn.nn.ImageGenerator` to the sub-pixel grid ``(H, W·C)``. One rule says which
encodings are 2-D: a registered encoding whose options include ``grid``, or an encoding module
with a ``grid`` attribute.
"""

from __future__ import annotations

from typing import Any

from .. import positional
from ..checks import is_positive_int
from ..registry import spec

#: ``positions`` of the image models: learned absolute positions, or none (the relative
#: encoding alone).
IMAGE_POSITIONS = ("learned", "none")


def image_size(value: int | tuple[int, int]) -> tuple[int, int]:
    """``(H, W)`` of ``value``: a positive int (a square image) or a pair of them.

    Raises:
        ValueError: anything else (bools, zeros, other lengths), naming the value.
    """
    if is_positive_int(value):
        return value, value  # type: ignore[return-value]
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(is_positive_int(s) for s in value)
    ):
        return int(value[0]), int(value[1])
    raise ValueError(f"image_size must be a positive int or (H, W), got {value!r}")


def planar_encoding(
    mechanism: str, options: dict[str, Any]
) -> str | positional.RelativePositionBias | None:
    """The relative encoding that ``mechanism`` with ``options`` (over its defaults) uses, if
    it lies on a 2-D grid: its name when the registered encoding takes a ``grid`` option, the
    module itself when it has a ``grid`` attribute; None otherwise."""
    rpe = {**spec(mechanism).defaults, **options}.get("rpe")
    if isinstance(rpe, positional.RelativePositionBias):
        return rpe if getattr(rpe, "grid", None) is not None else None
    if isinstance(rpe, str) and rpe in positional.available():
        return rpe if "grid" in positional.option_names(rpe) else None
    return None


def with_grid(
    mechanism: str, options: dict[str, Any], grid: tuple[int, int], *, what: str
) -> dict[str, Any]:
    """``options`` with ``grid`` filled in for a 2-D encoding (:func:`planar_encoding`), else
    unchanged; a module is kept as given.

    Args:
        mechanism, options: the attention and its options, as ``kattn.build`` takes them.
        grid: ``(h, w)``, the grid the model's tokens form.
        what: the grid's name in the error message (e.g. ``"the patch grid"``).

    Raises:
        ValueError: a ``grid`` option, or the module's ``grid``, differs from ``grid``.
    """
    rpe = planar_encoding(mechanism, options)
    if rpe is None:
        return options
    if isinstance(rpe, str):
        given, source = options.get("grid"), "grid="
        options = {**options, "grid": grid}
    else:
        given, source = getattr(rpe, "grid", None), "the rpe module's grid "
    if given is not None and tuple(given) != grid:
        raise ValueError(
            f"{source}{tuple(given)} disagrees with {what} {grid} of these images: leave grid "
            "out, the model sets it"
        )
    return options
