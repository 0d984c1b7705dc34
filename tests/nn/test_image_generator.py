"""``kattn.nn.ImageGenerator``: sub-pixel logits in raster order, the causal mask, decoding
step by step with the parallel forward's logits (softmax's cache, the 2-D relative positions'
cache), deterministic sampling, presets and refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kattn import positional
from kattn.nn import GENERATOR_PRESETS, ImageGenerator

C, H, W = 3, 3, 4
L = C * H * W
SHAPE = {"dim": 32, "depth": 2, "num_heads": 2, "ffn_dim": 64}
MODELS = {
    "softmax": {"mechanism": "softmax", "positions": "learned"},
    "nprf_rpe-toeplitz2d": {"mechanism": "nprf_rpe", "rpe": "toeplitz2d", "positions": "none"},
    "nprf_rpe-toeplitz2d-fft": {
        "mechanism": "nprf_rpe", "rpe": "toeplitz2d", "rpe_method": "fft", "positions": "none"
    },
    "softmax_rpe-toeplitz2d": {
        "mechanism": "softmax_rpe", "rpe": "toeplitz2d", "positions": "none"
    },
}  # fmt: skip


def model(case: str = "nprf_rpe-toeplitz2d", seed: int = 0) -> ImageGenerator:
    torch.manual_seed(seed)
    net = ImageGenerator(image_size=(H, W), channels=C, **SHAPE, **MODELS[case]).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a relative bias far from 0 (it starts at 0)
        for attn in net.lm.attentions():
            if getattr(attn, "rpe", None) is not None:
                bias = attn.rpe.bias
                bias.copy_(torch.randn(bias.shape, generator=g, dtype=bias.dtype))
    return net


def images(n: int = 2, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, C, H, W), generator=g).to(torch.uint8)


def test_shapes_and_scores():
    net, x = model(), images()
    logits = net(x)
    assert logits.shape == (2, L, 256)
    values = x.permute(0, 2, 3, 1).reshape(2, L).long()  # raster order (row, column, channel)
    assert torch.equal(net.subpixels(x), values)
    assert torch.equal(net.images(values), x)
    expected = -torch.log_softmax(logits, -1).gather(-1, values[..., None])[..., 0].mean(1)
    torch.testing.assert_close(net.nll(x), expected)
    assert torch.allclose(net.bits_per_dim(x), expected.mean() / math.log(2))
    assert 7.5 < net.bits_per_dim(x).item() < 8.5  # near uniform at initialisation


def test_the_grid_is_rows_by_subpixel_columns():
    net = model()
    assert net.grid == (H, W * C)
    assert all(a.rpe.grid == (H, W * C) for a in net.lm.attentions())
    with pytest.raises(ValueError, match=r"grid=\(4, 9\) disagrees with the sub-pixel grid"):
        ImageGenerator(image_size=(H, W), channels=C, **SHAPE, mechanism="nprf_rpe",
                       rpe="toeplitz2d", grid=(4, 9))  # fmt: skip
    ok = ImageGenerator(image_size=(H, W), channels=C, **SHAPE, mechanism="nprf_rpe",
                        rpe="toeplitz2d", grid=(H, W * C))  # fmt: skip
    assert ok.lm.attentions()[0].rpe.grid == (H, W * C)


def test_a_2d_encoding_module_must_have_the_sub_pixel_grid():
    rpe = positional.build("toeplitz2d", num_heads=2, grid=(H, W * C))
    net = ImageGenerator(image_size=(H, W), channels=C, **SHAPE, mechanism="nprf_rpe", rpe=rpe)
    assert all(a.rpe is rpe for a in net.lm.attentions())
    other = positional.build("toeplitz2d", num_heads=2, grid=(W * C, H))
    with pytest.raises(ValueError, match=r"module's grid \(12, 3\) disagrees with the sub-pixel"):
        ImageGenerator(image_size=(H, W), channels=C, **SHAPE, mechanism="nprf_rpe", rpe=other)


def test_the_input_carries_the_channel_being_predicted():
    net = model()
    tokens = torch.randint(0, 257, (1, 7), generator=torch.Generator().manual_seed(4))
    with_channel = net.lm.embed(tokens, start=5)
    with torch.no_grad():
        net.lm.channel.weight.zero_()
    added = with_channel - net.lm.embed(tokens, start=5)
    channels = torch.arange(5, 12) % C  # the channel of sub-pixel t is t mod C
    expected = model().lm.channel.weight[channels]
    torch.testing.assert_close(added[0], expected)


def test_the_embedding_dropout_follows_the_channel_term():
    """Drop(token + position + channel): an element dropped is 0, the channel term included."""
    torch.manual_seed(0)
    net = ImageGenerator(image_size=(H, W), channels=C, **SHAPE, dropout=0.5).double().train()
    tokens = torch.randint(0, 257, (2, 9), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(5)
    got = net.lm.embed(tokens, start=4)
    undropped = net.lm.encoder.embedding(tokens) + net.lm.encoder.position.weight[4:13]
    undropped = undropped + net.lm.channel.weight[torch.arange(4, 13) % C]
    torch.manual_seed(5)
    expected = F.dropout(undropped, 0.5, training=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert 0.3 < float((got == 0).double().mean()) < 0.7
    keys = set(net.state_dict())  # no new state: the keys of the language model and channel
    assert "lm.channel.weight" in keys and not any("dropout" in k for k in keys)


@pytest.mark.parametrize("case", ["nprf_rpe-toeplitz2d", "nprf_rpe-toeplitz2d-fft"])
def test_a_subpixel_changes_no_logit_at_or_before_it(case):
    net, x = model(case), images(1)
    base = net(x)
    for t in (0, 13, L - 2):  # sub-pixel t = (row, column, channel)
        changed = net.subpixels(x).clone()
        changed[0, t] = (changed[0, t] + 97) % 256
        other = net(net.images(changed))
        torch.testing.assert_close(other[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-10)
        assert (other[:, t + 1] - base[:, t + 1]).abs().max() > 1e-6


@pytest.mark.parametrize("case", list(MODELS))
def test_step_logits_equal_the_forward_at_every_position(case):
    """Teacher-forced decoding: the fixed images' sub-pixels go through prefill then step."""
    net, x = model(case), images()
    tokens = net.inputs(x)
    with torch.no_grad():
        expected = net(x)
        logits, state = net.lm.prefill(tokens[:, :1])
        rows = [logits[..., :256]]
        for t in range(1, L):
            step, state = net.lm.step(tokens[:, t], state)
            rows.append(step[:, None, :256])
    torch.testing.assert_close(torch.cat(rows, dim=1), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", ["softmax", "nprf_rpe-toeplitz2d", "softmax_rpe-toeplitz2d"])
def test_chunked_prefill_then_steps_equal_the_forward(case):
    """Prefill 5 tokens, then 12 more from that state, then one step per token."""
    net, x = model(case), images()
    tokens = net.inputs(x)
    with torch.no_grad():
        expected = net(x)
        first, state = net.lm.prefill(tokens[:, :5])
        second, state = net.lm.prefill(tokens[:, 5:17], state)
        rows = [first[..., :256], second[..., :256]]
        for t in range(17, L):
            step, state = net.lm.step(tokens[:, t], state)
            rows.append(step[:, None, :256])
    assert state.position == L
    torch.testing.assert_close(torch.cat(rows, dim=1), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", ["softmax", "nprf_rpe-toeplitz2d"])
def test_sampling_is_deterministic_given_a_generator(case):
    net = model(case).train()
    a = net.sample(3, generator=torch.Generator().manual_seed(7))
    b = net.sample(3, generator=torch.Generator().manual_seed(7))
    c = net.sample(3, generator=torch.Generator().manual_seed(8))
    assert a.shape == (3, C, H, W) and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert net.training  # the mode is restored


@pytest.mark.parametrize("case", ["softmax", "nprf_rpe-toeplitz2d"])
def test_greedy_samples_are_the_forward_argmax(case):
    net = model(case)
    drawn = net.sample(2, temperature=0.0)
    with torch.no_grad():
        assert torch.equal(net(drawn).argmax(-1), net.subpixels(drawn))


def test_sampling_refuses_a_mechanism_without_decoding():
    net = ImageGenerator(image_size=2, channels=1, **SHAPE, mechanism="longformer", window=2)
    assert net(images(1)[:, :1, :2, :2]).shape == (1, 4, 256)  # it trains
    with pytest.raises(NotImplementedError, match=r"'longformer'.*no recurrent form"):
        net.sample(1)
    with pytest.raises(ValueError, match="temperature"):
        model().sample(1, temperature=-1.0)


def test_bad_inputs_are_refused():
    net = model()
    with pytest.raises(TypeError, match="uint8"):
        net(images().float())
    with pytest.raises(ValueError, match=r"\(B, 3, 3, 4\)"):
        net(images()[:, :, :2])
    with pytest.raises(ValueError, match="positions"):
        ImageGenerator(image_size=4, positions="sinusoidal")
    with pytest.raises(ValueError, match="image_size"):
        ImageGenerator(image_size=(4, 0))
    with pytest.raises(ValueError, match="channels"):
        ImageGenerator(image_size=4, channels=0)


def test_presets():
    luo = GENERATOR_PRESETS["luo-imagenet32"]
    assert {k: luo[k] for k in ("depth", "dim", "num_heads", "num_features", "mechanism")} == {
        "depth": 6, "dim": 512, "num_heads": 8, "num_features": 32, "mechanism": "nprf_rpe"
    }  # fmt: skip
    assert luo["image_size"] * luo["image_size"] * luo["channels"] == 3072  # Luo et al. A.5
    small = ImageGenerator.from_preset("small", image_size=4)
    assert small.length == 48 and small.grid == (4, 12)
    assert small(torch.zeros(1, 3, 4, 4, dtype=torch.uint8)).shape == (1, 48, 256)
    with pytest.raises(ValueError, match="unknown preset"):
        ImageGenerator.from_preset("nope")


def test_training_lowers_the_loss_on_one_image():
    net = model("nprf_rpe-toeplitz2d").float().train()
    x = images(1)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    with torch.no_grad():
        before = float(net.bits_per_dim(x))
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(net(x).flatten(0, 1), net.subpixels(x).flatten())
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert float(net.bits_per_dim(x)) < before - 1.0
