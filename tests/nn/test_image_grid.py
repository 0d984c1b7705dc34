"""``kattn.nn.image_grid``: the image-size parser and the one rule for a 2-D relative encoding
that the Vision Transformer and the image generator share."""

import pytest
import torch

from kattn import positional
from kattn.nn import ImageGenerator, VisionTransformer
from kattn.nn.image_grid import image_size, planar_encoding, with_grid


def test_image_size_takes_an_int_or_a_pair():
    assert image_size(32) == (32, 32)
    assert image_size((3, 4)) == (3, 4) and image_size([5, 2]) == (5, 2)
    for bad in (0, True, 2.0, (4, 0), (1, 2, 3), (True, 2), "32", None):
        with pytest.raises(ValueError, match="image_size must be a positive int or"):
            image_size(bad)  # type: ignore[arg-type]


def test_a_2d_encoding_is_one_with_a_grid():
    grid_module = positional.build("toeplitz2d", num_heads=2, grid=(3, 4))
    line_module = positional.build("toeplitz", num_heads=2, max_len=12)
    assert planar_encoding("nprf_rpe", {"rpe": "toeplitz2d"}) == "toeplitz2d"
    assert planar_encoding("softmax_rpe", {"rpe": "toeplitz2d"}) == "toeplitz2d"
    assert planar_encoding("nprf_rpe", {"rpe": grid_module}) is grid_module
    assert planar_encoding("nprf_rpe", {}) is None  # its default, the 1-D Toeplitz encoding
    assert planar_encoding("nprf_rpe", {"rpe": line_module}) is None
    assert planar_encoding("nprf_rpe", {"rpe": "bucketed"}) is None
    assert planar_encoding("softmax", {}) is None


def test_with_grid_fills_in_or_checks_the_grid():
    options = {"rpe": "toeplitz2d", "num_features": 8}
    assert with_grid("nprf_rpe", options, (3, 4), what="the grid") == {**options, "grid": (3, 4)}
    filled = with_grid("nprf_rpe", {**options, "grid": [3, 4]}, (3, 4), what="the grid")
    assert filled["grid"] == (3, 4)  # a list that names the same grid is accepted
    assert with_grid("performer", {}, (3, 4), what="the grid") == {}
    module = positional.build("toeplitz2d", num_heads=2, grid=(3, 4))
    assert with_grid("nprf_rpe", {"rpe": module}, (3, 4), what="the grid") == {"rpe": module}
    with pytest.raises(ValueError, match=r"grid=\(4, 3\) disagrees with the tiles \(3, 4\)"):
        with_grid("nprf_rpe", {**options, "grid": (4, 3)}, (3, 4), what="the tiles")
    with pytest.raises(ValueError, match=r"module's grid \(3, 4\) disagrees with the tiles"):
        with_grid("nprf_rpe", {"rpe": module}, (4, 3), what="the tiles")


@pytest.mark.parametrize("rpe", ["toeplitz2d", "module"])
def test_both_image_models_apply_the_same_rule(rpe):
    """A ViT on 3×12 one-pixel patches and a generator on 3×4 RGB images (grid (H, W·C) =
    (3, 12)) set the same grid, and refuse a wrong one alike."""
    torch.manual_seed(0)
    shape = {"num_heads": 2, "mechanism": "nprf_rpe", "num_features": 8}
    given = positional.build("toeplitz2d", num_heads=2, grid=(3, 12)) if rpe == "module" else rpe
    vit = VisionTransformer(image_size=(3, 12), patch_size=1, dim=8, ffn_dim=8, num_layers=1,
                            rpe=given, **shape)  # fmt: skip
    gen = ImageGenerator(image_size=(3, 4), channels=3, dim=8, ffn_dim=8, depth=1, rpe=given,
                         positions="none", **shape)  # fmt: skip
    assert vit.layers[0].attn.attention.rpe.grid == (3, 12)
    assert gen.lm.attentions()[0].rpe.grid == (3, 12)
    wrong = positional.build("toeplitz2d", num_heads=2, grid=(12, 3))
    bad = {"rpe": wrong} if rpe == "module" else {"rpe": rpe, "grid": (12, 3)}
    with pytest.raises(ValueError, match=r"\(12, 3\) disagrees with the patch grid \(3, 12\)"):
        VisionTransformer(image_size=(3, 12), patch_size=1, dim=8, ffn_dim=8, num_layers=1,
                          **{**shape, **bad})  # fmt: skip
    with pytest.raises(ValueError, match=r"\(12, 3\) disagrees with the sub-pixel grid"):
        ImageGenerator(image_size=(3, 4), channels=3, dim=8, ffn_dim=8, depth=1,
                       positions="none", **{**shape, **bad})  # fmt: skip
