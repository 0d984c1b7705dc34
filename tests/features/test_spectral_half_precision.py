"""A learned spectral map cast to bf16 (``module.to(torch.bfloat16)``) computes its frequencies
and features in fp32, like the rest of the kernelized family: it gives the outputs of its fp32
copy up to the rounding of the output."""

import copy

import pytest
import torch

import kattn
from kattn.features.generative import GenerativeFeatures

from .test_learned_spectral_maps import SPECTRAL

MODES = ["eval", "train"]  # train: the generator's batch normalisation uses batch statistics


def pair(name, mode, seed):
    """A bf16 module and its fp32 copy with the same (bf16-representable) parameters."""
    torch.manual_seed(seed)
    half = kattn.build(name, head_dim=16, num_heads=2, resample_every="never")
    half = half.to(torch.bfloat16)
    full = copy.deepcopy(half).float()
    return half.train(mode == "train"), full.train(mode == "train")


def inputs(seed, length=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, length, 16, generator=g).bfloat16() for _ in range(3)]


def relative(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_the_spectral_family_is_the_expected_one():
    assert set(SPECTRAL) <= set(kattn.available())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SPECTRAL)
def test_frequencies_of_a_bf16_module_are_computed_in_fp32(name, mode):
    half, full = pair(name, mode, seed=0)
    omega = half.feature_map.frequencies()
    assert omega.dtype == torch.float32
    torch.testing.assert_close(omega, full.feature_map.frequencies(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SPECTRAL)
def test_bf16_module_matches_its_fp32_copy(name, mode):
    for seed in range(6):
        half, full = pair(name, mode, seed)
        q, k, v = (x.requires_grad_() for x in inputs(seed))
        out = half(q, k, v)
        assert out.dtype == torch.bfloat16
        q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
        ref = full(q32, k32, v32)
        # the output is rounded to bf16 (about 0.2% relative): seen at most 0.2% over these
        # seeds (fp32 frequencies), up to 47% (gmm_rks) with bf16 ones
        assert relative(out, ref) < 0.02, f"seed {seed}: {relative(out, ref):.3g}"
        weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed))
        grads = torch.autograd.grad((out.float() * weight).sum(), (q, k, v))
        grads_ref = torch.autograd.grad((ref * weight).sum(), (q32, k32, v32))
        for g, g_ref in zip(grads, grads_ref, strict=True):  # seen at most 1.2% (fastfood_rks)
            assert relative(g, g_ref) < 0.05, f"seed {seed}: {relative(g, g_ref):.3g}"


@pytest.mark.parametrize("name", ["generative_rks", "generative_prf"])
def test_bf16_generator_updates_its_running_statistics(name):
    half, full = pair(name, "train", seed=0)
    assert isinstance(half.feature_map, GenerativeFeatures)
    before = {n: b.clone() for n, b in half.feature_map.net.named_buffers()}
    q, k, v = inputs(0)
    half(q, k, v), full(q.float(), k.float(), v.float())
    after = dict(half.feature_map.net.named_buffers())
    for label, expected in full.feature_map.net.named_buffers():
        assert after[label].dtype == before[label].dtype  # kept in the module's dtype
        assert not torch.equal(after[label], before[label]), label
        torch.testing.assert_close(after[label], expected.to(after[label].dtype))
