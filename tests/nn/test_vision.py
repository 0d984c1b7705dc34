"""The Vision Transformer: shapes, the 2-D grid set by the model, shared or per-block relative
encodings, stochastic depth, a bag of patches without positions, gradients, refusals, presets."""

import pytest
import torch

from kattn import positional
from kattn.nn import VIT_PRESETS, EncoderLayer, VisionTransformer, vision_transformer
from kattn.nn.encoder import DropPath

from ..helpers import assert_close

SMALL = {"image_size": 16, "patch_size": 4, "num_classes": 5, "dim": 16, "num_layers": 2,
         "num_heads": 2, "ffn_dim": 32}  # fmt: skip
TOEPLITZ2D = {"mechanism": "nprf_rpe", "rpe": "toeplitz2d", "num_features": 32}


def images(b=3, c=3, h=16, w=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, h, w, generator=g, dtype=torch.float64).to(dtype)


def randomize_rpe(model, seed=1):
    """Non-zero relative biases (they start at 0, which is no position at all)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".rpe." in name:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def rpe_parameters(model):
    return [name for name, _ in model.named_parameters() if ".rpe." in name]


SOFTMAX, PERFORMER = {"mechanism": "softmax"}, {"mechanism": "performer", "num_features": 16}
NPRF_1D = {"mechanism": "nprf_rpe", "num_features": 16}  # its default 1-D Toeplitz encoding


@pytest.mark.parametrize(
    ("options", "pooling"),
    [(SOFTMAX, "gap"), (SOFTMAX, "cls"), (PERFORMER, "gap"), (PERFORMER, "cls"),
     (NPRF_1D, "gap"), (NPRF_1D, "cls"), (TOEPLITZ2D, "gap")],  # 2-D: no class token
    ids=["softmax-gap", "softmax-cls", "performer-gap", "performer-cls", "nprf_rpe-gap",
         "nprf_rpe-cls", "nprf_rpe-toeplitz2d-gap"],
)  # fmt: skip
def test_logits_and_features_have_the_documented_shapes(options, pooling):
    model = VisionTransformer(**SMALL, pooling=pooling, **options).eval()
    x = images()
    features = model.forward_features(x)
    assert features.shape == (3, 16 + (pooling == "cls"), 16)
    logits = model(x)
    assert logits.shape == (3, 5) and torch.isfinite(logits).all()
    pooled = features[:, 0] if pooling == "cls" else features.mean(dim=1)
    torch.testing.assert_close(logits, model.head(pooled))


@pytest.mark.parametrize("mechanism", ["nprf_rpe", "softmax_rpe"])
def test_the_grid_of_a_2d_encoding_is_the_patch_grid(mechanism):
    model = VisionTransformer(**{**SMALL, "image_size": (16, 24)}, mechanism=mechanism,
                              rpe="toeplitz2d")  # fmt: skip
    assert model.grid == (4, 6)
    assert all(layer.attn.attention.rpe.grid == (4, 6) for layer in model.layers)
    assert model(images(h=16, w=24)).shape == (3, 5)
    same = VisionTransformer(**{**SMALL, "image_size": (16, 24)}, mechanism=mechanism,
                             rpe="toeplitz2d", grid=(4, 6))  # fmt: skip
    assert same.layers[0].attn.attention.rpe.grid == (4, 6)


def test_one_pixel_patches_put_every_pixel_on_the_grid():
    model = VisionTransformer(**{**SMALL, "image_size": (3, 5), "patch_size": 1}, **TOEPLITZ2D)
    assert model.layers[0].attn.attention.rpe.grid == (3, 5)
    assert model.forward_features(images(h=3, w=5)).shape == (3, 15, 16)


def test_relative_encoding_shared_by_every_block_or_one_per_block():
    config = {**SMALL, "num_layers": 3, **TOEPLITZ2D}
    shared = VisionTransformer(**config)
    modules = [layer.attn.attention.rpe for layer in shared.layers]
    assert all(m is modules[0] for m in modules)
    assert rpe_parameters(shared) == ["layers.0.attn.attention.rpe.bias"]
    own = VisionTransformer(**config, rpe_shared=False)
    assert len({id(layer.attn.attention.rpe) for layer in own.layers}) == 3
    assert len(rpe_parameters(own)) == 3
    per_block = modules[0].bias.numel()
    assert per_block == 2 * 7 * 7  # heads × (2h − 1) × (2w − 1) on the 4×4 grid
    count = sum(p.numel() for p in own.parameters()) - sum(p.numel() for p in shared.parameters())
    assert count == 2 * per_block


def test_drop_path_rises_linearly_over_the_blocks_to_its_value():
    model = VisionTransformer(**{**SMALL, "num_layers": 4}, drop_path=0.3)
    rates = [layer.drop_path.p for layer in model.layers]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3]) and rates[-1] == 0.3
    assert VisionTransformer(**{**SMALL, "num_layers": 1}, drop_path=0.3).layers[0].drop_path.p == 0


def test_drop_path_in_evaluation_is_the_identity():
    torch.manual_seed(3)
    model = VisionTransformer(**SMALL, **TOEPLITZ2D, drop_path=0.5).eval()
    plain = VisionTransformer(**SMALL, **TOEPLITZ2D).eval()
    plain.load_state_dict(model.state_dict())
    x = images()
    with torch.no_grad():
        first, second, reference = model(x), model(x), plain(x)
    assert torch.equal(first, second)
    assert torch.equal(first, reference)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(x), reference)  # training does drop branches


def test_drop_path_one_drops_both_branches_of_a_block_in_training():
    layer = EncoderLayer(16, 2, 32, drop_path=1.0).train()
    x = images(4, 5, 16, 1)[..., 0]  # (B, L, dim)
    assert torch.equal(layer(x), x)
    assert not torch.equal(layer.eval()(x), x)


@pytest.mark.parametrize("norm_first", [True, False])
def test_drop_path_keeps_or_drops_each_example_and_rescales_the_kept(norm_first):
    """With the MLP's output zeroed, a pre-LN block is x + branch; each example's branch is
    either dropped or scaled by 1/(1 − p) (post-LN: LN1 of either, LN2 then adds nothing)."""
    torch.manual_seed(0)
    layer = EncoderLayer(16, 2, 32, drop_path=0.5, norm_first=norm_first)
    with torch.no_grad():
        layer.ffn[3].weight.zero_()
        layer.ffn[3].bias.zero_()
    x = images(32, 6, 16, 1, dtype=torch.float64)[..., 0]
    layer = layer.double()
    with torch.no_grad():
        branch = layer.eval()._attend(layer.norm_attn(x) if norm_first else x, None, False)
        out = layer.train()(x)
    if norm_first:
        kept = [(out[i] - x[i]).abs().max() > 1e-6 for i in range(32)]
        for i, k in enumerate(kept):
            assert_close(out[i], x[i] + 2 * branch[i] if k else x[i])
    else:
        ln1, ln2 = layer.norm_attn, layer.norm_ffn
        dropped = ln2(ln1(x))
        kept = [(out[i] - dropped[i]).abs().max() > 1e-6 for i in range(32)]
        for i, k in enumerate(kept):
            assert_close(out[i], ln2(ln1(x[i] + 2 * branch[i])) if k else dropped[i])
    assert 4 < sum(kept) < 28  # both outcomes, at about the rate p


@pytest.mark.parametrize("p", [-0.1, 1.5, True, "0.1"])
def test_drop_path_refuses_what_is_not_a_probability(p):
    with pytest.raises(ValueError, match="drop_path must be a probability"):
        DropPath(p)
    with pytest.raises(ValueError, match="drop_path must be a probability"):
        VisionTransformer(**SMALL, drop_path=p)


def permute_patches(x, perm, patch):
    """The image with its ``patch×patch`` blocks moved: block ``perm[i]`` to place ``i``."""
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    blocks = x.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5)
    blocks = blocks.reshape(b, gh * gw, c, patch, patch)[:, perm]
    blocks = blocks.reshape(b, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return blocks.reshape(b, c, h, w)


@pytest.mark.parametrize(
    ("options", "invariant"),
    [({"mechanism": "softmax"}, True), ({"mechanism": "nprf_rpe", "rpe": None}, True),
     (TOEPLITZ2D, False)],
    ids=["softmax", "nprf_rpe-no-rpe", "nprf_rpe-toeplitz2d"],
)  # fmt: skip
def test_without_positions_the_model_sees_a_bag_of_patches(options, invariant):
    torch.manual_seed(4)
    model = VisionTransformer(**SMALL, positions="none", **options).double().eval()
    randomize_rpe(model)
    x = images(dtype=torch.float64)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(5))
    moved = permute_patches(x, perm, 4)
    assert not torch.equal(moved, x)
    assert torch.equal(permute_patches(moved, perm.argsort(), 4), x)
    torch.testing.assert_close(model.patchify(moved), model.patchify(x)[:, perm])
    with torch.no_grad():
        logits, permuted = model(x), model(moved)
    if invariant:
        assert_close(permuted, logits)
    else:
        assert (permuted - logits).abs().max() > 1e-3


@pytest.mark.parametrize(
    "config",
    [{**TOEPLITZ2D, "rpe_shared": False}, {"mechanism": "softmax", "pooling": "cls"}],
    ids=["nprf_rpe-toeplitz2d-gap", "softmax-cls"],
)
def test_every_parameter_gets_a_gradient(config):
    torch.manual_seed(6)
    model = VisionTransformer(**SMALL, **config, drop_path=0.2)
    model(images()).logsumexp(dim=-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


def test_regularization_loss_sums_the_blocks_penalties():
    model = VisionTransformer(**SMALL, mechanism="ffk_linear")
    maps = [layer.attn.attention.feature_map for layer in model.layers]
    with torch.no_grad():
        for p in (p for fm in maps for p in fm.parameters()):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    parts = [fm.regularization_loss() for fm in maps]
    assert all(p > 0 for p in parts)
    torch.testing.assert_close(model.regularization_loss(), sum(parts))
    assert VisionTransformer(**SMALL).regularization_loss() == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**TOEPLITZ2D, "pooling": "cls"}, "the class token is not a cell of the patch grid"),
        ({**TOEPLITZ2D, "grid": (2, 8)}, r"grid=\(2, 8\) disagrees with the patch grid \(4, 4\)"),
        ({"image_size": 18}, r"image_size \(18, 18\) is not divisible by patch_size 4"),
        ({"image_size": (16, 15)}, "not divisible by patch_size"),
        ({"patch_size": 0}, "patch_size must be a positive int"),
        ({"image_size": (16, 16, 3)}, "image_size must be a positive int or"),
        ({"pooling": "mean"}, "pooling must be one of"),
        ({"positions": "sinusoidal"}, "positions must be one of"),
        ({"num_layers": 0}, "num_layers must be a positive int"),
    ],
    ids=["cls-with-2d", "grid", "size", "width", "patch", "size-3", "pooling", "positions",
         "layers"],
)  # fmt: skip
def test_refusals_name_the_option_and_why(config, message):
    with pytest.raises(ValueError, match=message):
        VisionTransformer(**{**SMALL, **config})


def test_a_2d_encoding_module_is_checked_and_shared_as_given():
    rpe = positional.build("toeplitz2d", num_heads=2, grid=(4, 4))
    model = VisionTransformer(**SMALL, mechanism="nprf_rpe", rpe=rpe)
    assert all(layer.attn.attention.rpe is rpe for layer in model.layers)
    with pytest.raises(ValueError, match="class token is not a cell"):
        VisionTransformer(**SMALL, mechanism="nprf_rpe", rpe=rpe, pooling="cls")
    with pytest.raises(ValueError, match="rpe is a module already"):
        VisionTransformer(**SMALL, mechanism="nprf_rpe", rpe=rpe, rpe_shared=False)
    other = positional.build("toeplitz2d", num_heads=2, grid=(2, 8))
    with pytest.raises(ValueError, match="disagrees with the patch grid"):
        VisionTransformer(**SMALL, mechanism="nprf_rpe", rpe=other)


def test_images_of_another_shape_or_dtype_are_refused():
    model = VisionTransformer(**SMALL)
    with pytest.raises(ValueError, match=r"images must be \(B, 3, 16, 16\)"):
        model(images(h=32))
    with pytest.raises(ValueError, match=r"images must be \(B, 3, 16, 16\)"):
        model(images(c=1))
    with pytest.raises(TypeError, match="images must be a float tensor"):
        model(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))


def test_deit_presets_have_the_deit_parameter_counts():
    """DeiT-Ti/S/B with a class token have the parameters of Touvron et al. 2021, Table 1
    (5.7M, 22M, 86M: timm's deit_*_patch16_224 counts); GAP has one position fewer."""
    expected = {"deit-tiny": 5_717_416, "deit-small": 22_050_664, "deit-base": 86_567_656}
    for name, count in expected.items():
        with torch.device("meta"):
            cls = vision_transformer(name, pooling="cls")
            gap = vision_transformer(name)
        dim = VIT_PRESETS[name]["dim"]
        assert sum(p.numel() for p in cls.parameters()) == count
        assert sum(p.numel() for p in gap.parameters()) == count - 2 * dim
        assert cls.grid == (14, 14) and len(cls.layers) == 12
        assert gap.pooling == "gap"  # the presets pool as Luo et al. 2021 (Swin), not DeiT


def test_presets_build_and_run():
    torch.manual_seed(8)
    tiny = vision_transformer("deit-tiny", **TOEPLITZ2D).eval()
    assert tiny.layers[0].attn.attention.rpe.grid == (14, 14)
    assert tiny.layers[-1].drop_path.p == 0.1
    with torch.no_grad():
        assert tiny(images(1, h=224, w=224)).shape == (1, 1000)
    small = vision_transformer("small", num_classes=3)
    assert small(images(2, h=32, w=32)).shape == (2, 3)
    assert set(VIT_PRESETS) == {"deit-tiny", "deit-small", "deit-base", "small"}
    with pytest.raises(ValueError, match="unknown preset 'deit-huge'"):
        vision_transformer("deit-huge")
