"""The Triton causal linear attention kernel in Triton's interpreter (CPU tensors) against
the PyTorch chunked path: odd lengths that chunks do not divide, feature and value sizes that
are not powers of two, padding with NaN in the padded keys and values, half-precision inputs,
gradients, and the refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import linear_attention_chunked
from kattn.ops.triton.causal_linear import causal_linear_attention_triton, interpreted

from ..helpers import padding_mask

# tests/conftest.py sets TRITON_INTERPRET=1 without CUDA, before triton is imported
pytestmark = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()), reason="neither CUDA nor the interpreter"
)


#: CPU tensors in the interpreter, CUDA tensors on a GPU; references are computed on the CPU.
DEVICE = "cpu" if interpreted() else "cuda"


def _features(b: int, h: int, length: int, m: int, dv: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(b, h, length, m, generator=g) + 0.05  # positive features, as PRF's
    fk = torch.rand(b, h, length, m, generator=g) + 0.05
    v = torch.randn(b, h, length, dv, generator=g)
    return tuple(x.to(DEVICE) for x in (fq, fk, v))


def _ref(*xs: torch.Tensor, **kw) -> torch.Tensor:
    return linear_attention_chunked(*(x.cpu().double() for x in xs), **kw)


@pytest.mark.parametrize(("length", "m", "dv", "chunk"), [(37, 8, 5, 16), (64, 16, 16, 32),
                                                          (100, 20, 24, 16)])  # fmt: skip
def test_the_kernel_equals_the_chunked_path(length: int, m: int, dv: int, chunk: int) -> None:
    fq, fk, v = _features(2, 3, length, m, dv)
    out = causal_linear_attention_triton(fq, fk, v, chunk_size=chunk)
    ref = _ref(fq, fk, v)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=2e-5)
    assert out.dtype == v.dtype


def test_padded_keys_count_nowhere_even_as_nan() -> None:
    fq, fk, v = _features(2, 2, 45, 8, 6)
    pad = padding_mask(2, 45, (0, 11)).to(DEVICE)
    fk2, v2 = fk.clone(), v.clone()
    fk2[1, :, 34:], v2[1, :, 34:] = float("nan"), float("nan")
    out = causal_linear_attention_triton(fq, fk2, v2, key_padding_mask=pad)
    ref = _ref(fq, fk, v, key_padding_mask=pad.cpu())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-5, atol=2e-5)


def test_causal_outputs_never_see_later_tokens() -> None:
    fq, fk, v = _features(1, 2, 50, 8, 8)
    out = causal_linear_attention_triton(fq, fk, v)
    fk2, v2 = fk.clone(), v.clone()
    fk2[:, :, 30:] *= 3.0
    v2[:, :, 30:] = -v2[:, :, 30:]
    out2 = causal_linear_attention_triton(fq, fk2, v2)
    assert torch.equal(out[:, :, :30], out2[:, :, :30])
    assert not torch.allclose(out[:, :, 30:], out2[:, :, 30:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v = _features(1, 2, 40, 16, 16)
    out = causal_linear_attention_triton(fq.to(dtype), fk.to(dtype), v.to(dtype))
    ref = _ref(*(x.to(dtype) for x in (fq, fk, v)))
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)


def test_gradients_are_those_of_the_chunked_path() -> None:
    fq, fk, v = (x.requires_grad_() for x in _features(1, 2, 33, 8, 4))
    g = torch.randn(1, 2, 33, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = causal_linear_attention_triton(fq, fk, v)
    grads = torch.autograd.grad(out, (fq, fk, v), g)
    cpu = [x.detach().cpu().double().requires_grad_() for x in (fq, fk, v)]
    expected = torch.autograd.grad(linear_attention_chunked(*cpu), cpu, g.cpu().double())
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-5)


def test_refusals() -> None:
    fq, fk, v = _features(1, 1, 8, 4, 4)
    with pytest.raises(ValueError, match="power of two"):
        causal_linear_attention_triton(fq, fk, v, chunk_size=24)
    with pytest.raises(ValueError, match="alike"):
        causal_linear_attention_triton(fq, fk[..., :3], v)
