"""The banded (bucketed) RPE Triton kernels in Triton's interpreter (CPU tensors) against
:func:`kattn.functional.banded_linear_attention` in float64: bands narrower and wider than a
chunk, causal and not, cross lengths, key log-scales, padding with NaN in the padded keys,
half precision, causality, gradients (the band's coefficients included, through T5 buckets)
and the refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import banded_linear_attention
from kattn.ops.triton import banded as banded_module
from kattn.ops.triton.banded import banded_linear_attention_triton
from kattn.positional.bucketed import BucketedBias

from ..helpers import padding_mask
from .kernel_device import DEVICE, needs_kernels
from .rpe_kernel_inputs import (
    assert_matches,
    assert_same_gradients,
    kernel_inputs,
    on_cpu64,
    refusing_reference,
)

pytestmark = needs_kernels


def _coefficients(h: int, left: int, right: int, seed: int = 2) -> torch.Tensor:
    """``(H, left + right + 1)`` log-coefficients spread over a few units."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, left + right + 1, generator=g) * 2.0).to(DEVICE)


def _ref(fq, fk, v, log_coeff, left, s=None, pad=None, *, causal):
    args = (on_cpu64(x) for x in (fq, fk, v, log_coeff))
    return banded_linear_attention(
        *args, left, causal=causal, k_log_scale=on_cpu64(s), key_padding_mask=on_cpu64(pad)
    )


@pytest.mark.parametrize(
    ("lq", "lk", "left", "right", "causal", "scaled"),
    [(45, 45, 5, 7, True, True), (70, 70, 1, 1, True, False), (45, 45, 5, 7, False, True),
     (37, 50, 3, 20, False, False), (50, 21, 9, 2, False, True)],
    ids=["causal-band5", "causal-band1", "full-5x7-scaled", "cross-37x50-wide-right",
         "cross-50x21-scaled"],
)  # fmt: skip
def test_the_kernels_equal_the_pytorch_path(
    lq: int, lk: int, left: int, right: int, causal: bool, scaled: bool
) -> None:
    fq, fk, v, s = kernel_inputs(2, 3, lq, lk, 8, 5)
    lc = _coefficients(3, left, right)
    s = s if scaled else None
    out = banded_linear_attention_triton(
        fq, fk, v, lc, left, causal=causal, k_log_scale=s, chunk_size=16
    )
    assert out.dtype == v.dtype and out.shape == (2, 3, lq, 5)
    assert_matches(out, _ref(fq, fk, v, lc, left, s, causal=causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_padded_keys_count_nowhere_even_as_nan(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(2, 2, 45, 45, 8, 6)
    lc = _coefficients(2, 4, 6)
    pad = padding_mask(2, 45, (0, 11)).to(DEVICE)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[1, :, 34:], v2[1, :, 34:], s2[1, :, 34:] = float("nan"), float("nan"), float("nan")
    out = banded_linear_attention_triton(
        fq, fk2, v2, lc, 4, causal=causal, k_log_scale=s2, key_padding_mask=pad
    )
    assert torch.isfinite(out).all()
    assert_matches(out, _ref(fq, fk, v, lc, 4, s, pad, causal=causal))


def test_causal_outputs_never_see_later_tokens() -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 50, 50, 8, 8)
    lc = _coefficients(2, 6, 3)
    out = banded_linear_attention_triton(fq, fk, v, lc, 6, causal=True, k_log_scale=s)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[:, :, 30:] *= 3.0
    v2[:, :, 30:] = -v2[:, :, 30:]
    s2[:, :, 30:] += 40.0  # a later key far larger than any before: no offset may see it
    out2 = banded_linear_attention_triton(fq, fk2, v2, lc, 6, causal=True, k_log_scale=s2)
    assert torch.equal(out[:, :, :30], out2[:, :, :30])
    assert not torch.allclose(out[:, :, 30:], out2[:, :, 30:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16)
    lc = _coefficients(2, 5, 5)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    out = banded_linear_attention_triton(fq, fk, v, lc, 5, causal=False, k_log_scale=s)
    assert out.dtype == dtype
    assert_matches(out, _ref(fq, fk, v, lc, 5, s, causal=False), tol=2e-2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_are_those_of_the_pytorch_path(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 33, 33, 8, 4)
    lc = _coefficients(2, 4, 3)
    pad = padding_mask(1, 33, (5,)).to(DEVICE)

    def kernel(fq, fk, v, s, lc):
        return banded_linear_attention_triton(
            fq, fk, v, lc, 4, causal=causal, k_log_scale=s, key_padding_mask=pad
        )

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, 4, s, pad, causal=causal)

    assert_same_gradients(kernel, reference, [fq, fk, v, s, lc])


def _refusing_kernel(monkeypatch: pytest.MonkeyPatch, left: int, **options):
    """The kernels with the PyTorch path made to raise: their gradients must be their own
    backward kernels' (the band's window sums and the far fields' scans)."""

    def kernel(fq, fk, v, s, lc):
        return banded_linear_attention_triton(fq, fk, v, lc, left, k_log_scale=s, **options)

    return refusing_reference(monkeypatch, banded_module, "banded_linear_attention", kernel)


@pytest.mark.parametrize(
    ("lq", "lk", "left", "right", "causal", "scaled"),
    [(45, 45, 5, 7, True, True), (40, 40, 1, 1, False, True), (29, 52, 3, 20, False, True),
     (41, 23, 9, 2, False, False)],
    ids=["causal-band5", "full-band1", "cross-29x52-wide-right", "cross-41x23-unscaled"],
)  # fmt: skip
def test_the_kernels_backward_equals_the_pytorch_paths_across_far_apart_weights(
    lq: int,
    lk: int,
    left: int,
    right: int,
    causal: bool,
    scaled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gradients come from the kernels' own backward (the PyTorch path, made to raise, is
    not run), in float64 equal to the PyTorch path's, the coefficients and the key log-scales
    tens of units apart (or no log-scales), with padding and chunks that do not divide the
    lengths."""
    fq, fk, v, s = (x.double() for x in kernel_inputs(2, 2, lq, lk, 8, 5, seed=3))
    s = s * 6.0 if scaled else None
    lc = _coefficients(2, left, right, seed=4).double() * 8.0
    pad = padding_mask(2, lk, (0, 9)).to(DEVICE)
    options = dict(causal=causal, key_padding_mask=pad, chunk_size=16)
    kernel = _refusing_kernel(monkeypatch, left, **options)

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, left, s, pad, causal=causal)

    if s is None:
        assert_same_gradients(
            lambda fq, fk, v, lc: kernel(fq, fk, v, None, lc),
            lambda fq, fk, v, lc: reference(fq, fk, v, None, lc),
            [fq, fk, v, lc],
            tol=1e-9,
        )
    else:
        assert_same_gradients(kernel, reference, [fq, fk, v, s, lc], tol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_kernels_backward_of_half_inputs_is_close_to_the_exact_gradients(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half inputs: the kernels' backward (fp32 sums, the half inputs' product precision)
    close to the float64 gradients of the same rounded inputs."""
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16, seed=9)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    kernel = _refusing_kernel(monkeypatch, 5, causal=True)

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, 5, s, causal=True)

    inputs = [fq, fk, v, s, _coefficients(2, 5, 6, seed=10)]
    assert_same_gradients(kernel, reference, inputs, tol=3e-2)


def test_the_buckets_biases_get_gradients() -> None:
    bias = BucketedBias(num_heads=2, num_buckets=8, max_distance=12).to(DEVICE)
    with torch.no_grad():
        bias.bias.copy_(torch.randn(2, 8, generator=torch.Generator().manual_seed(3)))
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 8, 4)
    band = bias.band_log_coefficients()
    out = banded_linear_attention_triton(fq, fk, v, band, bias.left, k_log_scale=s)
    out.square().sum().backward()
    got = bias.bias.grad.clone()
    bias.zero_grad()
    ref = banded_linear_attention(fq, fk, v, bias.band_log_coefficients(), bias.left,
                                  k_log_scale=s)  # fmt: skip
    ref.square().sum().backward()
    used = bias.band_buckets.unique()  # (bucket 4, future offset 0, is never used)
    assert got[:, used].abs().min() > 0  # every bucket of the band is seen at L = 40
    torch.testing.assert_close(got, bias.bias.grad, rtol=1e-4, atol=1e-6)


def test_refusals() -> None:
    fq, fk, v, _ = kernel_inputs(1, 2, 8, 8, 4, 4)
    lc = _coefficients(2, 2, 2)
    with pytest.raises(ValueError, match="power of two"):
        banded_linear_attention_triton(fq, fk, v, lc, 2, chunk_size=8)
    with pytest.raises(ValueError, match="left >= 1 and right >= 1"):
        banded_linear_attention_triton(fq, fk, v, lc, 4)
    with pytest.raises(ValueError, match=r"\(H, left \+ right \+ 1\)"):
        banded_linear_attention_triton(fq, fk, v, lc[:1], 2)
    with pytest.raises(ValueError, match="Lq == Lk"):
        banded_linear_attention_triton(fq, fk[:, :, :5], v[:, :, :5], lc, 2, causal=True)
    with pytest.raises(ValueError, match=r"\(B, H, Lk, M\)"):
        banded_linear_attention_triton(fq, fk[..., :3], v, lc, 2)
