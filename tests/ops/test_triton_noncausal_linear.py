"""The Triton non-causal linear attention kernels (forward and backward) in Triton's
interpreter (CPU tensors) against the PyTorch parallel path: Lq != Lk, odd lengths, feature
and value sizes that differ and are not powers of two, key log-scales, padding with NaN and
infinite log-scales in the padded keys, signed features, half precision, gradients of every
input in float64 and float32."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import linear_attention_parallel
from kattn.ops.triton.noncausal_linear import linear_attention_triton

from ..helpers import padding_mask
from .kernel_device import DEVICE, needs_kernels
from .linear_inputs import linear_inputs

pytestmark = needs_kernels


def _ref(fq, fk, v, s=None, **kw) -> torch.Tensor:
    cpu = [None if x is None else x.cpu().double() for x in (fq, fk, v, s)]
    return linear_attention_parallel(*cpu[:3], k_log_scale=cpu[3], **kw)


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
@pytest.mark.parametrize(("b", "h", "lq", "lk", "m", "dv"), [
    (2, 3, 37, 37, 8, 5), (1, 2, 20, 75, 16, 16), (3, 1, 50, 9, 20, 70),
])  # fmt: skip
def test_the_kernels_equal_the_parallel_path(b, h, lq, lk, m, dv, log_scales) -> None:
    fq, fk, v, s = linear_inputs(b, h, lq, lk, m, dv, log_scales=log_scales)
    out = linear_attention_triton(fq, fk, v, k_log_scale=s)
    assert out.shape == (b, h, lq, dv) and out.dtype == v.dtype
    torch.testing.assert_close(out.cpu().double(), _ref(fq, fk, v, s), rtol=2e-5, atol=2e-5)


def test_padded_keys_count_nowhere_even_as_nan() -> None:
    fq, fk, v, s = linear_inputs(2, 2, 30, 45, 8, 6, log_scales=True)
    pad = padding_mask(2, 45, (0, 11))
    fk2, v2 = fk.clone(), v.clone()
    fk2[1, :, 34:], v2[1, :, 34:] = float("nan"), float("nan")
    s2 = s.masked_fill(pad[:, None].to(DEVICE), float("inf"))
    out = linear_attention_triton(fq, fk2, v2, k_log_scale=s2, key_padding_mask=pad.to(DEVICE))
    assert torch.isfinite(out).all()
    ref = _ref(fq, fk, v, s, key_padding_mask=pad)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(("log_scales", "signed"), [(False, False), (True, False), (True, True)],
                         ids=["plain", "log_scales", "signed"])  # fmt: skip
def test_gradients_are_those_of_the_parallel_path(dtype, log_scales, signed) -> None:
    fq, fk, v, s = linear_inputs(
        2, 2, 23, 41, 7, 5, dtype=dtype, log_scales=log_scales, signed=signed
    )
    inputs = [x.requires_grad_() for x in (fq, fk, v, s) if x is not None]
    pad = padding_mask(2, 41, (0, 6)).to(DEVICE)
    eps = 1e-6
    g = torch.randn(2, 2, 23, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = linear_attention_triton(fq, fk, v, k_log_scale=s, key_padding_mask=pad, eps=eps)
    grads = torch.autograd.grad(out, inputs, g.to(DEVICE, dtype))
    cpu = [x.detach().cpu().double().requires_grad_() for x in inputs]
    ref = linear_attention_parallel(*cpu[:3], k_log_scale=cpu[3] if s is not None else None,
                                    key_padding_mask=pad.cpu(), eps=eps)  # fmt: skip
    expected = torch.autograd.grad(ref, cpu, g)
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-5)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), want, **tol)


def test_gradcheck_in_float64() -> None:
    fq, fk, v, s = linear_inputs(1, 2, 11, 17, 3, 2, dtype=torch.float64, log_scales=True)
    inputs = tuple(x.requires_grad_() for x in (fq, fk, v, s))

    def attend(fq, fk, v, s):
        return linear_attention_triton(fq, fk, v, k_log_scale=s)

    assert torch.autograd.gradcheck(attend, inputs, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v, s = linear_inputs(1, 2, 40, 33, 16, 16, log_scales=True)
    half = [x.to(dtype).requires_grad_() for x in (fq, fk, v)]
    out = linear_attention_triton(*half, k_log_scale=s)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.detach().cpu().double(), _ref(*half, s), rtol=1e-2, atol=1e-2)
    grads = torch.autograd.grad(out.sum(), half)
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_refusals() -> None:
    fq, fk, v, _ = linear_inputs(1, 1, 8, 6, 4, 4)
    with pytest.raises(ValueError, match="phi_k"):
        linear_attention_triton(fq, fk[..., :3], v)
    with pytest.raises(ValueError, match="k_log_scale"):
        linear_attention_triton(fq, fk, v, k_log_scale=fq[..., 0])
