"""The Triton causal linear attention kernels (forward and backward) in Triton's interpreter
(CPU tensors) against the PyTorch chunked path: odd lengths that chunks do not divide, feature
and value sizes that are not powers of two and differ, several batches and heads, key
log-scales with their causal-safe offsets, padding with NaN in the padded keys and values,
half-precision inputs, gradients of every input in float64 and float32, a prefill from a
given state, and the refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import linear_attention_chunked, linear_attention_init_state
from kattn.functional.linear_causal import linear_attention_prefill
from kattn.ops.triton.causal_linear import (
    causal_linear_attention_triton,
    causal_linear_prefill_triton,
)

from ..helpers import padding_mask
from .kernel_device import DEVICE, needs_kernels
from .linear_inputs import linear_inputs

pytestmark = needs_kernels


def _ref(fq, fk, v, s=None, **kw) -> torch.Tensor:
    cpu = [None if x is None else x.cpu().double() for x in (fq, fk, v, s)]
    return linear_attention_chunked(*cpu[:3], k_log_scale=cpu[3], **kw)


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
@pytest.mark.parametrize(("b", "h", "length", "m", "dv", "chunk"), [
    (2, 3, 37, 8, 5, 16), (1, 2, 64, 16, 16, 32), (3, 1, 100, 20, 24, 16),
    (1, 1, 70, 6, 80, 32),  # values wider than one program's block
])  # fmt: skip
def test_the_kernel_equals_the_chunked_path(b, h, length, m, dv, chunk, log_scales) -> None:
    fq, fk, v, s = linear_inputs(b, h, length, length, m, dv, log_scales=log_scales)
    out = causal_linear_attention_triton(fq, fk, v, k_log_scale=s, chunk_size=chunk)
    torch.testing.assert_close(out.cpu().double(), _ref(fq, fk, v, s), rtol=2e-5, atol=2e-5)
    assert out.dtype == v.dtype


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
def test_padded_keys_count_nowhere_even_as_nan(log_scales: bool) -> None:
    fq, fk, v, s = linear_inputs(2, 2, 45, 45, 8, 6, log_scales=log_scales)
    pad = padding_mask(2, 45, (3, 11), left=True)
    pad[1, 40:] = True
    fk2, v2 = fk.clone(), v.clone()
    fk2[1, :, 40:], v2[1, :, 40:] = float("nan"), float("nan")
    s2 = None if s is None else s.masked_fill(pad[:, None].to(DEVICE), float("inf"))
    out = causal_linear_attention_triton(fq, fk2, v2, k_log_scale=s2,
                                         key_padding_mask=pad.to(DEVICE))  # fmt: skip
    ref = _ref(fq, fk, v, s, key_padding_mask=pad)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
def test_causal_outputs_never_see_later_tokens(log_scales: bool) -> None:
    fq, fk, v, s = linear_inputs(1, 2, 50, 50, 8, 8, log_scales=log_scales)
    out = causal_linear_attention_triton(fq, fk, v, k_log_scale=s)
    fk2, v2 = fk.clone(), v.clone()
    fk2[:, :, 30:] *= 3.0
    v2[:, :, 30:] = -v2[:, :, 30:]
    s2 = None if s is None else torch.cat([s[:, :, :30], s[:, :, 30:] + 50.0], dim=2)
    out2 = causal_linear_attention_triton(fq, fk2, v2, k_log_scale=s2)
    # bitwise: not even a stabiliser looks ahead
    assert torch.equal(out[:, :, :30], out2[:, :, :30])
    assert not torch.allclose(out[:, :, 30:], out2[:, :, 30:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v, s = linear_inputs(1, 2, 40, 40, 16, 16, log_scales=True)
    half = [x.to(dtype) for x in (fq, fk, v)]
    out = causal_linear_attention_triton(*half, k_log_scale=s)
    ref = _ref(*half, s)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)
    grads = torch.autograd.grad(
        causal_linear_attention_triton(*(x.requires_grad_() for x in half), k_log_scale=s).sum(),
        half,
    )
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
def test_gradients_are_those_of_the_chunked_path(dtype: torch.dtype, log_scales: bool) -> None:
    fq, fk, v, s = linear_inputs(2, 2, 41, 41, 7, 5, dtype=dtype, log_scales=log_scales)
    inputs = [x.requires_grad_() for x in (fq, fk, v, s) if x is not None]
    pad = padding_mask(2, 41, (0, 6)).to(DEVICE)
    g = torch.randn(2, 2, 41, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = causal_linear_attention_triton(fq, fk, v, k_log_scale=s, key_padding_mask=pad,
                                         chunk_size=16)  # fmt: skip
    grads = torch.autograd.grad(out, inputs, g.to(DEVICE, dtype))
    cpu = [x.detach().cpu().double().requires_grad_() for x in inputs]
    ref = linear_attention_chunked(*cpu[:3], k_log_scale=cpu[3] if s is not None else None,
                                   key_padding_mask=pad.cpu())  # fmt: skip
    expected = torch.autograd.grad(ref, cpu, g)
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), want, **tol)
    assert (grads[1][1, :, -6:] == 0).all() and (grads[2][1, :, -6:] == 0).all()


def test_gradcheck_in_float64() -> None:
    fq, fk, v, s = linear_inputs(1, 2, 19, 19, 3, 2, dtype=torch.float64, log_scales=True)
    inputs = tuple(x.requires_grad_() for x in (fq, fk, v, s))

    def attend(fq, fk, v, s):
        return causal_linear_attention_triton(fq, fk, v, k_log_scale=s, chunk_size=16)

    # fast mode (random projections of the Jacobians): a full one is minutes in the interpreter
    assert torch.autograd.gradcheck(attend, inputs, fast_mode=True)


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
def test_prefill_from_a_state_equals_the_pytorch_prefill(log_scales: bool) -> None:
    fq, fk, v, s = linear_inputs(2, 2, 50, 50, 6, 5, dtype=torch.float64, log_scales=log_scales)
    first, rest = slice(0, 21), slice(21, 50)
    states = []
    for prefill in (linear_attention_prefill, causal_linear_prefill_triton):
        state = linear_attention_init_state(2, 2, 6, 0, device=DEVICE, dtype=torch.float64)
        outs = []
        for part in (first, rest):
            scale = None if s is None else s[:, :, part]
            out, state = prefill(fq[:, :, part], fk[:, :, part], v[:, :, part], state,
                                 k_log_scale=scale, chunk_size=16)  # fmt: skip
            outs.append(out)
        states.append((torch.cat(outs, dim=2), *state))
    for got, want in zip(states[1], states[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(states[1][0], _ref(fq, fk, v, s), rtol=1e-9, atol=1e-10)


def test_refusals() -> None:
    fq, fk, v, _ = linear_inputs(1, 1, 8, 8, 4, 4)
    with pytest.raises(ValueError, match="power of two"):
        causal_linear_attention_triton(fq, fk, v, chunk_size=24)
    with pytest.raises(ValueError, match="power of two"):
        causal_linear_attention_triton(fq, fk, v, chunk_size=256)
    with pytest.raises(ValueError, match=r"\(B, H, Lk, M\)"):
        causal_linear_attention_triton(fq, fk[..., :3], v)
    with pytest.raises(ValueError, match="k_log_scale"):
        causal_linear_attention_triton(fq, fk, v, k_log_scale=fq[..., 0, None])
    state = linear_attention_init_state(1, 1, 4, 4, device=DEVICE)
    with pytest.raises(NotImplementedError, match="no backward"):
        causal_linear_prefill_triton(fq.requires_grad_(), fk, v, state)


def test_the_default_sizes_lower_the_chunk_and_keep_the_result() -> None:
    # M = 256, Dv = 128: the forward runs chunks of 32 over value blocks of 64, the backward
    # chunks of 16 (common.scan_tiles), asked for 64; 37 tokens fill no chunk exactly
    g = torch.Generator().manual_seed(5)
    fq, fk = (torch.rand(1, 1, 37, 256, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 37, 128, generator=g, dtype=torch.float64)
    s = torch.randn(1, 1, 37, generator=g, dtype=torch.float64)
    weight = torch.randn(1, 1, 37, 128, generator=g, dtype=torch.float64)
    results = []
    for kernel, device in ((causal_linear_attention_triton, DEVICE), (None, "cpu")):
        leaves = [x.to(device).requires_grad_() for x in (fq, fk, v, s)]
        if kernel is None:
            out = linear_attention_chunked(*leaves[:3], k_log_scale=leaves[3])
        else:
            out = kernel(*leaves[:3], k_log_scale=leaves[3], chunk_size=64)
        grads = torch.autograd.grad((out * weight.to(device)).sum(), leaves)
        results.append([out.cpu(), *(x.cpu() for x in grads)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
