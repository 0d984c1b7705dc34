"""Inside ``torch.autocast`` the kernelized family and SimpleTRON still compute their features,
sums and normalisers in fp32 (the contract), so their outputs equal those outside it."""

import pytest
import torch

import kattn
from kattn.attention.kernelized import KernelizedAttention
from kattn.attention.simpletron import SimpletronAttention

from ..helpers import step_through

FP32_SUMS = [
    name
    for name in kattn.available()
    if issubclass(type(kattn.build(name, head_dim=8, num_heads=1, max_len=8)),
                  (KernelizedAttention, SimpletronAttention))
]  # fmt: skip


def test_the_family_is_the_expected_one():
    assert {"performer", "rfa", "nprf_rpe", "fastfood_rks", "gmm_rks", "simpletron"} <= set(
        FP32_SUMS
    )


@pytest.mark.parametrize("name", FP32_SUMS)
def test_bf16_autocast_leaves_outputs_and_gradients_unchanged(name):
    torch.manual_seed(0)
    attn = kattn.build(name, head_dim=16, num_heads=2, max_len=96).eval()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 96, 16, generator=g, requires_grad=True) for _ in range(3))
    for causal in [False, True] if attn.supports_causal else [False]:
        exact = attn(q, k, v, causal=causal)
        (grad_exact,) = torch.autograd.grad(exact.square().sum(), q)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(q, k, v, causal=causal)
        (grad,) = torch.autograd.grad(out.square().sum(), q)  # backward after the region
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, exact)
        torch.testing.assert_close(grad, grad_exact)


def test_decoding_steps_under_autocast_equal_the_parallel_forward():
    torch.manual_seed(0)
    attn = kattn.build("performer", head_dim=16, num_heads=2, num_features=32).eval()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        full = attn(q, k, v, causal=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            head, state = attn.prefill(q[:, :, :30], k[:, :, :30], v[:, :, :30])
            tail, _ = step_through(attn.step, q, k, v, state, start=30)
    torch.testing.assert_close(torch.cat([head, tail], dim=2), full, rtol=1e-4, atol=1e-5)
