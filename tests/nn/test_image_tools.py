"""``kattn.nn.image_tools``: histogram bits/dim computed by hand, the image grid's layout, and
PNG files that parse back to the same pixels (by hand with zlib, and with Pillow if present)."""

from __future__ import annotations

import math
import struct
import zlib

import pytest
import torch

from kattn.nn.image_tools import PNG_SIGNATURE, histogram_bits_per_dim, image_grid, write_png


def test_histogram_bits_per_dim_by_hand():
    # two training images of 1×1×2 sub-pixels: values (0, 1) and (0, 0)
    train = torch.tensor([[[[0, 1]]], [[[0, 0]]]], dtype=torch.uint8)
    test = torch.tensor([[[[1, 0]]]], dtype=torch.uint8)
    bits = histogram_bits_per_dim(train, test)
    # one histogram: counts 0 → 3, 1 → 1 of 4, smoothed over 256 values: p = (n + 1) / 260
    marginal = -(math.log2(2 / 260) + math.log2(4 / 260)) / 2
    # per position: the first saw 0 twice (p(1) = 1/258), the second 1 and 0 (p(0) = 2/258)
    per_position = -(math.log2(1 / 258) + math.log2(2 / 258)) / 2
    assert bits == pytest.approx({"marginal": marginal, "per_position": per_position}, rel=1e-12)


def test_histograms_of_uniform_noise_score_about_eight_bits():
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (400, 3, 4, 4), generator=g).to(torch.uint8)
    test = torch.randint(0, 256, (50, 3, 4, 4), generator=g).to(torch.uint8)
    bits = histogram_bits_per_dim(train, test)
    assert 7.9 < bits["marginal"] < 8.1
    assert bits["per_position"] > bits["marginal"]  # 400 images per position overfit noise


def histograms_in_one_piece(train: torch.Tensor, test: torch.Tensor) -> dict[str, float]:
    """The formula on whole splits in int64, as the function computed it before it counted
    chunk by chunk."""
    train_values = train.reshape(train.shape[0], -1).long()
    test_values = test.reshape(test.shape[0], -1).long()
    positions = train_values.shape[1]
    marginal = torch.bincount(train_values.flatten(), minlength=256).double()
    log_p = torch.log((marginal + 1) / (marginal.sum() + 256))
    marginal_bits = -log_p[test_values].mean() / math.log(2)
    offsets = torch.arange(positions) * 256
    counts = torch.bincount((train_values + offsets).flatten(), minlength=positions * 256)
    log_p = torch.log((counts.double() + 1) / (train_values.shape[0] + 256))
    position_bits = -log_p[test_values + offsets].mean() / math.log(2)
    return {"marginal": float(marginal_bits), "per_position": float(position_bits)}


def test_histograms_of_chunks_equal_those_of_the_whole_splits(monkeypatch):
    g = torch.Generator().manual_seed(1)
    # skewed values, so that the two histograms differ from uniform and from each other
    train = (torch.rand(300, 3, 4, 5, generator=g) ** 3 * 256).to(torch.uint8)
    test = (torch.rand(70, 3, 4, 5, generator=g) ** 3 * 256).to(torch.uint8)
    whole = histogram_bits_per_dim(train, test)
    assert whole == pytest.approx(histograms_in_one_piece(train, test), rel=1e-12)
    assert 1.0 < whole["marginal"] < 7.5 and whole["per_position"] != whole["marginal"]
    # uneven chunks, an empty one, and a one-pass generator for test: the very same numbers
    chunks = [train[:7], train[7:7], train[7:200], train[200:]]
    assert histogram_bits_per_dim(chunks, (part for part in test.split(16))) == whole
    # a whole tensor is counted in chunks too (the int64 copy is one chunk at a time)
    monkeypatch.setattr("kattn.nn.image_tools.HISTOGRAM_CHUNK", 64)
    assert histogram_bits_per_dim(train, test) == whole


def test_histogram_inputs_are_checked():
    x = torch.zeros(2, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="share"):
        histogram_bits_per_dim(x, x[:, :, :1])
    with pytest.raises(TypeError, match="uint8"):
        histogram_bits_per_dim(x.float(), x)
    with pytest.raises(ValueError, match="N >= 1"):
        histogram_bits_per_dim(x, x[:0])
    with pytest.raises(ValueError, match="N >= 1"):
        histogram_bits_per_dim([], x)
    with pytest.raises(ValueError, match="the chunks of train must share"):
        histogram_bits_per_dim([x, x[:, :, :1]], x)
    shared = r"must share \(C, H, W\), got \(1, 2, 2\) and \(2, 1, 2\)"
    with pytest.raises(ValueError, match=shared):
        histogram_bits_per_dim(x, x.view(2, 2, 1, 2))
    with pytest.raises(TypeError, match="uint8"):
        histogram_bits_per_dim([x, x.float()], x)


def test_image_grid_layout():
    images = torch.arange(1, 4, dtype=torch.uint8).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    grid = image_grid(images, nrow=2, padding=1, pad_value=9)
    assert grid.shape == (1, 2 * 3 + 1, 2 * 3 + 1)
    assert torch.equal(grid[0, 1:3, 1:3], torch.full((2, 2), 1, dtype=torch.uint8))
    assert torch.equal(grid[0, 1:3, 4:6], torch.full((2, 2), 2, dtype=torch.uint8))
    assert torch.equal(grid[0, 4:6, 1:3], torch.full((2, 2), 3, dtype=torch.uint8))
    assert (grid[0, 4:6, 4:6] == 9).all() and (grid[0, 0] == 9).all() and (grid[0, :, 3] == 9).all()


def read_png(data: bytes) -> tuple[dict[str, int], bytes]:
    """The IHDR fields and the raw pixel rows (filter bytes removed), checking every CRC."""
    assert data[:8] == PNG_SIGNATURE
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks.append((kind, body))
        pos += 12 + length
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    w, h, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, compression, filtering, interlace) == (8, 0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    stride = len(raw) // h
    assert all(raw[r * stride] == 0 for r in range(h))  # filter type 0 on every row
    pixels = b"".join(raw[r * stride + 1 : (r + 1) * stride] for r in range(h))
    return {"width": w, "height": h, "colour": colour}, pixels


@pytest.mark.parametrize("channels", [1, 3], ids=["grey", "rgb"])
def test_png_parses_back_to_the_same_pixels(tmp_path, channels):
    g = torch.Generator().manual_seed(channels)
    image = torch.randint(0, 256, (channels, 5, 7), generator=g).to(torch.uint8)
    path = write_png(tmp_path / "x.png", image)
    header, pixels = read_png(path.read_bytes())
    assert header == {"width": 7, "height": 5, "colour": {1: 0, 3: 2}[channels]}
    assert pixels == image.permute(1, 2, 0).contiguous().numpy().tobytes()
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as opened:
        assert opened.mode == ("L" if channels == 1 else "RGB") and opened.size == (7, 5)
        assert opened.tobytes() == pixels


def test_a_batch_is_written_as_a_grid(tmp_path):
    images = torch.randint(0, 256, (5, 3, 4, 4), generator=torch.Generator().manual_seed(3))
    images = images.to(torch.uint8)
    header, pixels = read_png(write_png(tmp_path / "g.png", images, nrow=3).read_bytes())
    grid = image_grid(images, nrow=3)
    assert (header["height"], header["width"]) == tuple(grid.shape[1:]) == (14, 20)
    assert pixels == grid.permute(1, 2, 0).contiguous().numpy().tobytes()


def test_png_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="1 \\(greyscale\\) or 3 \\(RGB\\)"):
        write_png(tmp_path / "x.png", torch.zeros(2, 3, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        write_png(tmp_path / "x.png", torch.zeros(3, 3, 3))
