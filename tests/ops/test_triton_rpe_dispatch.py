"""The hook of the relative-position kernels (:mod:`kattn.ops.triton.rpe_dispatch`): each
covered encoding's ``attend`` by its kernel equals the encoding's own (outputs, gradients of
its parameters), and what has no kernel says so."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.ops.triton.rpe_dispatch import rpe_attend_triton, rpe_kernel_gap
from kattn.positional.bucketed import BucketedBias
from kattn.positional.decay import DecayBias
from kattn.positional.toeplitz import Toeplitz2dBias, ToeplitzBias

from .kernel_device import DEVICE, needs_kernels
from .rpe_kernel_inputs import kernel_inputs

pytestmark = needs_kernels

ENCODINGS = {
    "decay": lambda: DecayBias(num_heads=2, decay_terms=2),
    "bucketed": lambda: BucketedBias(num_heads=2, num_buckets=8, max_distance=12),
    "toeplitz": lambda: ToeplitzBias(num_heads=2, max_len=40, method="dense"),
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_the_kernel_attend_is_the_encodings(name: str, causal: bool) -> None:
    torch.manual_seed(0)
    encoding = ENCODINGS[name]().to(DEVICE)
    with torch.no_grad():
        for p in encoding.parameters():
            p.add_(0.3 * torch.randn_like(p))
    assert rpe_kernel_gap(encoding) is None
    fq, fk, v, s = kernel_inputs(1, 2, 35, 35, 8, 4)
    options = dict(causal=causal, k_log_scale=s, eps=1e-6, chunk_size=64, block_size=256)
    out = rpe_attend_triton(encoding, fq, fk, v, **options)
    got = torch.autograd.grad(out.square().sum(), list(encoding.parameters()))
    ref = encoding.attend(fq, fk, v, **options)
    want = torch.autograd.grad(ref.square().sum(), list(encoding.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_what_has_no_kernel_says_why() -> None:
    fft = ToeplitzBias(num_heads=2, max_len=16, method="fft")
    assert "'fft'" in str(rpe_kernel_gap(fft))
    grid = Toeplitz2dBias(num_heads=2, grid=(4, 4))
    assert rpe_kernel_gap(grid) == "Toeplitz2dBias has no Triton kernel"
    fq, fk, v, _ = kernel_inputs(1, 2, 16, 16, 4, 4)
    with pytest.raises(NotImplementedError, match="no Triton kernel"):
        rpe_attend_triton(grid, fq, fk, v, eps=1e-6)
