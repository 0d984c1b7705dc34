"""Augment: random resized crop bounds and fallback, flips, identity at full scale, mixup and
CutMix targets against the pixels, determinism for a seeded generator, RandAugment's extra."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from kattn.data import IMAGENET_MEAN, IMAGENET_STD, Augment, normalize
from kattn.data.image_augment import random_resized_crop_params


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(n: int = 8, side: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randint(0, 256, (n, 3, side, side), generator=gen(seed), dtype=torch.uint8)
    return images, torch.arange(n) % 5


def test_crop_area_and_aspect_stay_in_bounds() -> None:
    g = gen(0)
    height, width, scale = 48, 64, (0.08, 1.0)
    areas, aspects = [], []
    for _ in range(500):
        top, left, h, w = random_resized_crop_params(height, width, scale, g)
        assert 0 <= top <= height - h and 0 <= left <= width - w
        # w and h are rounded: the unrounded sides lie within 0.5 of them
        assert (h - 0.5) * (w - 0.5) <= scale[1] * height * width
        assert (h + 0.5) * (w + 0.5) >= scale[0] * height * width
        assert (w + 0.5) / (h - 0.5) >= 3 / 4 and (w - 0.5) / (h + 0.5) <= 4 / 3
        areas.append(h * w / (height * width))
        aspects.append(w / h)
    assert min(areas) < 0.15 and max(areas) > 0.85  # the whole range is drawn
    assert min(aspects) < 0.8 and max(aspects) > 1.25


def test_crop_falls_back_to_the_centre() -> None:
    # a 20×40 image at scale 1: every try is taller than 20, so the centre crop of aspect 4/3
    assert random_resized_crop_params(20, 40, (1.0, 1.0), gen(0)) == (0, 6, 20, 27)
    assert random_resized_crop_params(16, 16, (1.0, 1.0), gen(0)) == (0, 0, 16, 16)


def test_full_scale_without_flip_is_the_image() -> None:
    images, labels = batch()
    same = Augment(16, crop_scale=(1.0, 1.0), flip=False, num_classes=5)
    out, targets = same(images, labels, gen(1))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, images.float() / 255, rtol=0, atol=0)
    assert targets is labels  # hard labels without mixup or CutMix
    half = Augment(8, crop_scale=(1.0, 1.0), flip=False, num_classes=5)
    out, _ = half(images, labels, gen(1))
    expected = F.interpolate(images.double(), size=(8, 8), mode="bilinear", antialias=True)
    torch.testing.assert_close(out.double(), expected / 255, rtol=0, atol=1e-6)


def test_flip_flips_some_images() -> None:
    images, labels = batch(16)
    out, _ = Augment(16, crop_scale=(1.0, 1.0), num_classes=5)(images, labels, gen(2))
    plain, flipped = images.float() / 255, images.flip(-1).float() / 255
    is_plain = (out == plain).flatten(1).all(1)
    is_flipped = (out == flipped).flatten(1).all(1)
    assert bool((is_plain ^ is_flipped).all())  # each image one or the other
    assert 0 < int(is_flipped.sum()) < 16


def test_random_crops_are_deterministic_for_a_seeded_generator() -> None:
    images, labels = batch()
    augment = Augment(12, mixup=0.8, cutmix=1.0, num_classes=5)
    first = augment(images, labels, gen(3))
    second = augment(images, labels, gen(3))
    other = augment(images, labels, gen(4))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], other[0])
    assert first[0].shape == (8, 3, 12, 12) and first[0].min() >= 0 and first[0].max() <= 1


def mixed_lambda(targets: torch.Tensor, labels: torch.Tensor) -> float:
    """λ read from the target of image 0, whose partner (the last image) has another label."""
    assert labels[0] != labels[-1]
    return float(targets[0, labels[0]])


def test_mixup_targets_are_the_mixed_lambda() -> None:
    images, labels = batch()
    augment = Augment(16, crop_scale=(1.0, 1.0), flip=False, mixup=0.4, num_classes=5)
    out, targets = augment(images, labels, gen(5))
    assert targets.shape == (8, 5)
    torch.testing.assert_close(targets.sum(1), torch.ones(8))
    lam = mixed_lambda(targets, labels)
    assert 0 < lam < 1
    x = images.double() / 255
    torch.testing.assert_close(out.double(), lam * x + (1 - lam) * x.flip(0), rtol=0, atol=1e-6)
    partner = labels.flip(0)
    expected = lam * F.one_hot(labels, 5) + (1 - lam) * F.one_hot(partner, 5)
    torch.testing.assert_close(targets.double(), expected.double(), rtol=0, atol=1e-6)


def test_cutmix_lambda_is_the_unpasted_area() -> None:
    labels = torch.arange(8) % 5
    images = (torch.arange(8) * 30).to(torch.uint8)[:, None, None, None].expand(8, 3, 16, 16)
    augment = Augment(16, crop_scale=(1.0, 1.0), flip=False, cutmix=1.0, num_classes=5)
    pasted = []
    for seed in range(6):
        out, targets = augment(images.contiguous(), labels, gen(seed))
        torch.testing.assert_close(targets.sum(1), torch.ones(8))
        partner = images.flip(0).float() / 255
        from_partner = (out == partner).all(1).double().mean((1, 2))  # (n,) pasted fraction
        assert torch.allclose(from_partner, from_partner[0].expand(8))  # one box per batch
        lam = mixed_lambda(targets, labels)
        assert lam == pytest.approx(1 - float(from_partner[0]), abs=1e-6)
        pasted.append(float(from_partner[0]))
    assert max(pasted) > 0  # some batch got a box


def test_mixup_and_cutmix_alternate() -> None:
    images, labels = batch()
    augment = Augment(16, crop_scale=(1.0, 1.0), flip=False, mixup=1.0, cutmix=1.0, num_classes=5)
    kinds = set()
    for seed in range(12):
        out, _ = augment(images, labels, gen(seed))
        x = images.float() / 255
        exact = ((out == x) | (out == x.flip(0))).all()  # CutMix copies pixels, mixup blends
        kinds.add("cutmix" if bool(exact) else "mixup")
    assert kinds == {"cutmix", "mixup"}


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="crop_scale"):
        Augment(16, crop_scale=(0.0, 1.0), num_classes=5)
    with pytest.raises(ValueError, match="mixup is the α"):
        Augment(16, mixup=-1.0, num_classes=5)
    with pytest.raises(ValueError, match="image_size"):
        Augment(0, num_classes=5)
    images, labels = batch()
    with pytest.raises(ValueError, match="uint8"):
        Augment(16, num_classes=5)(images.float(), labels, gen(0))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        Augment(16, mixup=1.0, num_classes=3)(images, labels, gen(0))


def test_randaugment_needs_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ImportError, match=r"pip install 'kattn\[vision\]'"):
        Augment(16, randaugment=(2, 9), num_classes=5)


class FakeRandAugment:
    """Stands in for torchvision's RandAugment: adds a draw of torch's global generator, up to
    5·magnitude, to one (C, H, W) uint8 image."""

    def __init__(self, num_ops: int, magnitude: int, num_magnitude_bins: int = 31) -> None:
        self.magnitude = magnitude
        self.num_magnitude_bins = num_magnitude_bins

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        assert image.dtype == torch.uint8 and image.ndim == 3
        shift = torch.randint(0, 5 * self.magnitude, ())
        return (image.int() + shift).clamp(0, 255).to(torch.uint8)


@pytest.fixture
def fake_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = types.ModuleType("torchvision.transforms.v2")
    v2.RandAugment = FakeRandAugment  # type: ignore[attr-defined]
    for name in ("torchvision", "torchvision.transforms"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torchvision.transforms.v2", v2)
    monkeypatch.setattr(sys.modules["torchvision.transforms"], "v2", v2, raising=False)


@pytest.mark.usefixtures("fake_torchvision")
def test_randaugment_magnitude_counts_in_tenths_as_timm() -> None:
    augment = Augment(4, randaugment=(2, 9), num_classes=5)
    assert isinstance(augment.randaugment, FakeRandAugment)
    # 11 bins: magnitude 9 is 9/10 of each range (timm's rand-m9, DeiT), not torchvision's 9/30
    assert augment.randaugment.num_magnitude_bins == 11 and augment.randaugment.magnitude == 9
    for bad in (11, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"magnitude must be an int in \[0, 10\]"):
            Augment(4, randaugment=(2, bad), num_classes=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_ops must be a positive int"):
        Augment(4, randaugment=(0, 9), num_classes=5)


@pytest.mark.usefixtures("fake_torchvision")
def test_randaugment_seeds_only_the_cpu_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.manual_seed would reseed CUDA's generators too (and fork_rng(devices=[]) would not
    restore them): the augmentation must never call it."""

    def refuse(seed: int) -> None:
        raise AssertionError("torch.manual_seed reseeds every CUDA generator")

    monkeypatch.setattr(torch, "manual_seed", refuse)
    monkeypatch.setattr(torch.random, "manual_seed", refuse)
    images = torch.full((4, 3, 4, 4), 100, dtype=torch.uint8)
    augment = Augment(4, crop_scale=(1.0, 1.0), randaugment=(2, 9), num_classes=5)
    first, _ = augment(images, torch.arange(4), gen(7))
    second, _ = augment(images, torch.arange(4), gen(7))
    assert torch.equal(first, second) and not torch.equal(first, images.float() / 255)


@pytest.mark.usefixtures("fake_torchvision")
def test_randaugment_per_image_and_seeded() -> None:
    images = torch.full((8, 3, 4, 4), 100, dtype=torch.uint8)
    labels = torch.arange(8) % 5
    augment = Augment(4, crop_scale=(1.0, 1.0), randaugment=(2, 10), num_classes=5)
    state = torch.get_rng_state()
    first, _ = augment(images, labels, gen(7))
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left alone
    second, _ = augment(images, labels, gen(7))
    other, _ = augment(images, labels, gen(8))
    assert torch.equal(first, second) and not torch.equal(first, other)
    shifts = (first * 255).round()[:, 0, 0, 0] - 100
    assert len(shifts.unique()) > 1  # one draw per image
    assert bool((first.flatten(1) == first.flatten(1)[:, :1]).all())  # uniform per image


def test_randaugment_with_torchvision() -> None:
    pytest.importorskip("torchvision.transforms.v2", reason="RandAugment needs torchvision")
    images, labels = batch()
    augment = Augment(16, randaugment=(2, 9), num_classes=5)
    first, _ = augment(images, labels, gen(7))
    second, _ = augment(images, labels, gen(7))
    assert torch.equal(first, second) and first.shape == (8, 3, 16, 16)


def test_normalize() -> None:
    mean = torch.tensor(IMAGENET_MEAN)[None, :, None, None].expand(2, 3, 4, 4)
    torch.testing.assert_close(normalize(mean), torch.zeros(2, 3, 4, 4))
    ones = normalize(torch.ones(1, 3, 2, 2))
    expected = (1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(ones[0, :, 0, 0], expected)
    with pytest.raises(ValueError, match="C = len"):
        normalize(torch.ones(1, 1, 2, 2))
