"""The Triton decoding step of causal linear attention in Triton's interpreter (CPU tensors)
against the PyTorch step: outputs and states over many tokens from an empty state (with and
without key log-scales), equality with the causal forward, in-place updates only where the
PyTorch step makes them, half-precision values, and the refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import (
    LinearState,
    linear_attention_chunked,
    linear_attention_init_state,
    linear_attention_step,
)
from kattn.ops.triton.linear_step import linear_step_triton

from .kernel_device import DEVICE, needs_kernels
from .linear_inputs import linear_inputs

pytestmark = needs_kernels

B, H, L, M, DV = 2, 3, 12, 7, 5


def _decode(step, fq, fk, v, s):
    state = linear_attention_init_state(B, H, M, 0, device=DEVICE, dtype=fq.dtype)
    outs = []
    for t in range(L):
        token = slice(t, t + 1)
        scale = None if s is None else s[:, :, token]
        out, state = step(fq[:, :, token], fk[:, :, token], v[:, :, token], state,
                          k_log_scale=scale)  # fmt: skip
        outs.append(out)
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("log_scales", [False, True], ids=["plain", "log_scales"])
def test_steps_equal_the_pytorch_steps_and_the_causal_forward(log_scales: bool) -> None:
    fq, fk, v, s = linear_inputs(B, H, L, L, M, DV, dtype=torch.float64, log_scales=log_scales)
    out, state = _decode(linear_step_triton, fq, fk, v, s)
    ref, ref_state = _decode(linear_attention_step, fq, fk, v, s)
    for got, want in zip((out, *state), (ref, *ref_state), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    forward = linear_attention_chunked(fq, fk, v, k_log_scale=s)
    torch.testing.assert_close(out, forward, rtol=1e-12, atol=1e-12)


def test_the_state_is_updated_in_place_only_where_it_may_be() -> None:
    fq, fk, v, _ = linear_inputs(B, H, L, L, M, DV)
    token = (fq[:, :, :1], fk[:, :, :1], v[:, :, :1])
    state = linear_attention_init_state(B, H, M, DV, device=DEVICE)
    _, new = linear_step_triton(*token, state)
    assert (
        new.kv.data_ptr() == state.kv.data_ptr() and new.k_sum.data_ptr() == state.k_sum.data_ptr()
    )
    # strided sums (here a transposed copy) are read, not written
    kv = torch.rand(B, H, DV, M, device=DEVICE).transpose(-1, -2)
    strided = LinearState(kv, torch.rand(B, H, M, device=DEVICE), torch.zeros(B, H, device=DEVICE))
    before = LinearState(*(x.clone() for x in strided))
    out, new = linear_step_triton(*token, strided)
    ref, ref_state = linear_attention_step(*token, before)
    assert torch.equal(strided.kv, before.kv) and new.kv.data_ptr() != kv.data_ptr()
    assert torch.equal(strided.offset, before.offset)  # a new offset, always
    torch.testing.assert_close(out, ref)
    for got, want in zip(new, ref_state, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_values_give_a_close_half_output(dtype: torch.dtype) -> None:
    fq, fk, v, s = linear_inputs(B, H, L, L, M, DV, log_scales=True)
    out, state = _decode(linear_step_triton, fq, fk, v.to(dtype), s)
    ref, _ = _decode(linear_attention_step, fq, fk, v.to(dtype), s)
    assert out.dtype == dtype and state.kv.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-2, atol=1e-2)


def test_refusals() -> None:
    fq, fk, v, _ = linear_inputs(B, H, L, L, M, DV)
    state = linear_attention_init_state(B, H, M, 0, device=DEVICE)
    with pytest.raises(ValueError, match="a step takes"):
        linear_step_triton(fq[:, :, :2], fk[:, :, :2], v[:, :, :2], state)
    with pytest.raises(ValueError, match="k_log_scale"):
        linear_step_triton(fq[:, :, :1], fk[:, :, :1], v[:, :, :1], state, k_log_scale=fq[..., 0])
    with pytest.raises(NotImplementedError, match="no backward"):
        linear_step_triton(fq[:, :, :1].requires_grad_(), fk[:, :, :1], v[:, :, :1], state)
