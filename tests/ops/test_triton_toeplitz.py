"""The exact blocked Toeplitz RPE Triton kernel in Triton's interpreter (CPU tensors) against
:func:`kattn.functional.rpe_linear_attention_blocked` in float64: causal and not, cross
lengths, lengths that blocks do not divide, key log-scales, coefficients far apart (the online
row maximum), padding with NaN in the padded keys, half precision, causality, gradients (the
encoding's bias included) and the refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional.rpe_blocked import ToeplitzRows, rpe_linear_attention_blocked
from kattn.ops.triton import toeplitz_blocked as toeplitz_module
from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton
from kattn.positional.toeplitz import ToeplitzBias

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


def _coefficients(h: int, lq: int, lk: int, scale: float = 2.0, seed: int = 2) -> torch.Tensor:
    """``(H, Lq + Lk − 1)`` log-coefficients spread over a few units (``scale``)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, lq + lk - 1, generator=g) * scale).to(DEVICE)


def _ref(fq, fk, v, log_coeff, s=None, pad=None, *, causal):
    fq, fk, v, log_coeff = (on_cpu64(x) for x in (fq, fk, v, log_coeff))
    return rpe_linear_attention_blocked(
        fq, fk, v, ToeplitzRows(log_coeff, fq.shape[2]), causal=causal,
        k_log_scale=on_cpu64(s), key_padding_mask=on_cpu64(pad),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "scaled", "spread"),
    [(45, 45, True, True, 2.0), (37, 37, True, False, 30.0), (45, 45, False, False, 2.0),
     (37, 50, False, True, 2.0), (50, 21, False, True, 30.0)],
    ids=["causal-45-scaled", "causal-37-spread", "full-45", "cross-37x50-scaled",
         "cross-50x21-spread"],
)  # fmt: skip
def test_the_kernel_equals_the_blocked_path(
    lq: int, lk: int, causal: bool, scaled: bool, spread: float
) -> None:
    fq, fk, v, s = kernel_inputs(2, 3, lq, lk, 8, 5)
    lc = _coefficients(3, lq, lk, spread)
    s = s if scaled else None
    out = toeplitz_linear_attention_triton(
        fq, fk, v, lc, causal=causal, k_log_scale=s, block_size=16
    )
    assert out.dtype == v.dtype and out.shape == (2, 3, lq, 5)
    assert_matches(out, _ref(fq, fk, v, lc, s, causal=causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_padded_keys_count_nowhere_even_as_nan(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(2, 2, 45, 45, 8, 6)
    lc = _coefficients(2, 45, 45)
    pad = padding_mask(2, 45, (0, 11), left=True).to(DEVICE)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[1, :, :11], v2[1, :, :11], s2[1, :, :11] = float("nan"), float("nan"), float("nan")
    out = toeplitz_linear_attention_triton(
        fq, fk2, v2, lc, causal=causal, k_log_scale=s2, key_padding_mask=pad
    )
    assert torch.isfinite(out).all()
    ref = _ref(fq, fk, v, lc, s, pad, causal=causal)
    if causal:  # queries that see only padding give 0, as the blocked path's
        assert ref[1, :, :11].abs().max() == 0
    assert_matches(out, ref)


def test_causal_outputs_never_see_later_tokens() -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 50, 50, 8, 8)
    lc = _coefficients(2, 50, 50)
    out = toeplitz_linear_attention_triton(fq, fk, v, lc, causal=True, k_log_scale=s)
    fk2, v2, s2, lc2 = fk.clone(), v.clone(), s.clone(), lc.clone()
    fk2[:, :, 30:] *= 3.0
    v2[:, :, 30:] = -v2[:, :, 30:]
    s2[:, :, 30:] += 40.0  # a later key far larger than any before: no maximum may see it
    lc2[:, 50:] += 40.0  # so are the future offsets' coefficients
    out2 = toeplitz_linear_attention_triton(fq, fk2, v2, lc2, causal=True, k_log_scale=s2)
    assert torch.equal(out[:, :, :30], out2[:, :, :30])
    assert not torch.allclose(out[:, :, 30:], out2[:, :, 30:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16)
    lc = _coefficients(2, 40, 40)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    out = toeplitz_linear_attention_triton(fq, fk, v, lc, causal=True, k_log_scale=s)
    assert out.dtype == dtype
    assert_matches(out, _ref(fq, fk, v, lc, s, causal=True), tol=2e-2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_are_those_of_the_blocked_path(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 33, 33, 8, 4)
    lc = _coefficients(2, 33, 33)
    pad = padding_mask(1, 33, (5,)).to(DEVICE)

    def kernel(fq, fk, v, s, lc):
        return toeplitz_linear_attention_triton(
            fq, fk, v, lc, causal=causal, k_log_scale=s, key_padding_mask=pad
        )

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, s, pad, causal=causal)

    assert_same_gradients(kernel, reference, [fq, fk, v, s, lc])


def _refusing_kernel(monkeypatch: pytest.MonkeyPatch, **options):
    """The kernel with the PyTorch blocked path made to raise: its gradients must be those of
    the window sums' own backward kernels."""

    def kernel(fq, fk, v, s, lc):
        return toeplitz_linear_attention_triton(fq, fk, v, lc, k_log_scale=s, **options)

    return refusing_reference(monkeypatch, toeplitz_module, "_toeplitz_reference", kernel)


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "scaled"),
    [(45, 45, True, True), (29, 52, False, True), (41, 23, False, False)],
    ids=["causal-45", "cross-29x52", "cross-41x23-unscaled"],
)
def test_the_kernels_backward_equals_the_blocked_paths_across_far_apart_weights(
    lq: int, lk: int, causal: bool, scaled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gradients come from the kernels' own backward (the blocked path, made to raise, is
    not run), in float64 equal to the blocked path's, with coefficients and key log-scales
    tens of units apart (or no log-scales), padding, and blocks that do not divide the
    lengths."""
    fq, fk, v, s = (x.double() for x in kernel_inputs(2, 2, lq, lk, 8, 5, seed=3))
    s = s * 6.0 if scaled else None
    lc = _coefficients(2, lq, lk, 15.0, seed=4).double()
    pad = padding_mask(2, lk, (0, 9)).to(DEVICE)
    kernel = _refusing_kernel(monkeypatch, causal=causal, key_padding_mask=pad, block_size=16)

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, s, pad, causal=causal)

    if s is None:
        assert_same_gradients(
            lambda fq, fk, v, lc: kernel(fq, fk, v, None, lc),
            lambda fq, fk, v, lc: reference(fq, fk, v, None, lc),
            [fq, fk, v, lc],
            tol=1e-9,
        )
    else:
        assert_same_gradients(kernel, reference, [fq, fk, v, s, lc], tol=1e-9)


@pytest.mark.parametrize("wanted", [0, 1, 2, 3, 4], ids=["q", "k", "v", "log-scales", "bias"])
@pytest.mark.parametrize(("lq", "causal"), [(37, True), (29, False)], ids=["causal", "cross"])
def test_a_gradient_of_one_input_alone_equals_the_blocked_paths(
    wanted: int, lq: int, causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backward runs only the kernels, and their parts, that a wanted gradient needs
    (the others' inputs stand in for their gradients and must stay as they are)."""
    fq, fk, v, s = (x.double() for x in kernel_inputs(1, 2, lq, 37, 8, 4, seed=6))
    inputs = [fq, fk, v, s, _coefficients(2, lq, 37, seed=7).double()]
    before = [x.clone() for x in inputs]
    leaf = inputs[wanted].detach().requires_grad_()
    inputs[wanted] = leaf
    out = _refusing_kernel(monkeypatch, causal=causal, block_size=16)(*inputs)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(8), dtype=out.dtype)
    (got,) = torch.autograd.grad((out * weight.to(DEVICE)).sum(), leaf)
    cpu = on_cpu64(leaf.detach()).requires_grad_()
    ref_inputs = [on_cpu64(x.detach()) for x in inputs]
    ref_inputs[wanted] = cpu
    fq, fk, v, s, lc = ref_inputs
    (want,) = torch.autograd.grad((_ref(fq, fk, v, lc, s, causal=causal) * weight).sum(), cpu)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)
    assert all(torch.equal(x.detach(), y) for x, y in zip(inputs, before, strict=True))


@pytest.mark.parametrize(("lq", "lk"), [(0, 6), (6, 0)], ids=["no-queries", "no-keys"])
def test_an_empty_side_gives_zero_gradients_and_leaves_the_inputs_as_they_are(
    lq: int, lk: int
) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, lq, lk, 8, 4)
    lc = _coefficients(2, lq, lk) if lq + lk > 1 else torch.zeros(2, 0)
    before = [x.clone() for x in (fq, fk, v, s, lc)]
    v.requires_grad_()
    out = toeplitz_linear_attention_triton(fq, fk, v, lc, k_log_scale=s)
    assert out.shape == (1, 2, lq, 4) and (out == 0).all()
    (grad,) = torch.autograd.grad(out.sum(), v)
    assert grad.shape == v.shape and (grad == 0).all()
    assert all(torch.equal(x.detach(), y) for x, y in zip((fq, fk, v, s, lc), before, strict=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_kernels_backward_of_half_inputs_is_close_to_the_exact_gradients(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half inputs: the kernels' backward (fp32 sums, the half inputs' product precision)
    close to the float64 gradients of the same rounded inputs."""
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16, seed=9)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    kernel = _refusing_kernel(monkeypatch, causal=False)

    def reference(fq, fk, v, s, lc):
        return _ref(fq, fk, v, lc, s, causal=False)

    inputs = [fq, fk, v, s, _coefficients(2, 40, 40, seed=10)]
    assert_same_gradients(kernel, reference, inputs, tol=3e-2)


def test_the_encodings_bias_gets_gradients() -> None:
    bias = ToeplitzBias(num_heads=2, max_len=48, method="dense").to(DEVICE)
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 8, 4)
    out = toeplitz_linear_attention_triton(
        fq, fk, v, bias.log_coefficients(40, 40), causal=True, k_log_scale=s
    )
    out.square().sum().backward()
    got = bias.bias.grad.clone()
    bias.zero_grad()
    ref = bias.attend(fq, fk, v, causal=True, k_log_scale=s)
    ref.square().sum().backward()
    past = slice(48 - 40, 48)  # offsets −39…0
    assert got[:, past].abs().min() > 0 and got[:, 48:].abs().max() == 0
    torch.testing.assert_close(got, bias.bias.grad, rtol=1e-4, atol=1e-6)


def test_refusals() -> None:
    fq, fk, v, _ = kernel_inputs(1, 2, 8, 8, 4, 4)
    lc = _coefficients(2, 8, 8)
    with pytest.raises(ValueError, match="power of two"):
        toeplitz_linear_attention_triton(fq, fk, v, lc, block_size=48)
    with pytest.raises(ValueError, match=r"\(H, Lq \+ Lk − 1\)"):
        toeplitz_linear_attention_triton(fq, fk, v, lc[:, 1:])
    with pytest.raises(ValueError, match="Lq == Lk"):
        lc_cross = _coefficients(2, 8, 5)
        toeplitz_linear_attention_triton(fq, fk[:, :, :5], v[:, :, :5], lc_cross, causal=True)


def test_float64_inputs_are_summed_in_float64() -> None:
    fq, fk, v, s = (x.double() for x in kernel_inputs(1, 2, 21, 21, 4, 3))
    lc = _coefficients(2, 21, 21).double()
    out = toeplitz_linear_attention_triton(fq, fk, v, lc, causal=True, k_log_scale=s)
    assert out.dtype == torch.float64
    assert_matches(out, _ref(fq, fk, v, lc, s, causal=True), tol=1e-12)
