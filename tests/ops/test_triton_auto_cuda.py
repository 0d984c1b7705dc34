"""The default GPU path: on CUDA, ``backend="auto"`` (the default) picks the Triton kernels for
fp32 inputs, and a mechanism at its default sizes (Performer, 256 features) gives the outputs
and gradients of ``backend="torch"``. Run by ``benchmarks/gpu_check.py`` on a GPU; without
CUDA there is no such path to check (the interpreter tests cover the kernels)."""

from __future__ import annotations

import pytest
import torch

import kattn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the path is CUDA's")


@pytest.mark.parametrize("causal", [True, False])
def test_auto_on_cuda_equals_the_pytorch_path_at_default_sizes(causal: bool) -> None:
    torch.manual_seed(0)
    auto = kattn.build("performer", head_dim=64, num_heads=4).cuda()
    torch_path = kattn.build("performer", head_dim=64, num_heads=4, backend="torch").cuda()
    torch_path.load_state_dict(auto.state_dict())
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=g).cuda().requires_grad_() for _ in range(3))
    outs = [module(q, k, v, causal=causal) for module in (auto, torch_path)]
    assert auto.backend == "auto"
    weight = torch.randn(outs[0].shape, generator=g).cuda()
    grads = [torch.autograd.grad((out * weight).sum(), (q, k, v)) for out in outs]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
