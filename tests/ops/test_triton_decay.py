"""The decaying-RPE Triton kernel in Triton's interpreter (CPU tensors) against
:func:`kattn.functional.decay_linear_attention` in float64: causal and not, cross lengths,
lengths that chunks do not divide, key log-scales, padding with NaN in the padded keys, half
precision, causality, gradients (the decay rates and weights included) and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.functional import decay_linear_attention
from kattn.ops.triton import decay as decay_module
from kattn.ops.triton.decay import decay_linear_attention_triton, kernel_backward_fits
from kattn.positional.decay import DecayBias

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


def _rates(h: int, r: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``log α (H, 2, R)`` and ``log γ (H, 2, R)``: rates from fast (γ ≈ 0.5) to slow."""
    g = torch.Generator().manual_seed(seed)
    log_alpha = torch.randn(h, 2, r, generator=g)
    log_gamma = -torch.rand(h, 2, r, generator=g) * 0.7 - 1e-3
    return log_alpha.to(DEVICE), log_gamma.to(DEVICE)


def _ref(fq, fk, v, la, lg, s=None, pad=None, *, causal):
    args = (on_cpu64(x) for x in (fq, fk, v, la, lg))
    return decay_linear_attention(
        *args, causal=causal, k_log_scale=on_cpu64(s), key_padding_mask=on_cpu64(pad)
    )


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "scaled"),
    [(37, 37, True, False), (50, 50, True, True), (45, 45, False, True), (21, 33, False, False),
     (40, 19, False, True)],
    ids=["causal-37", "causal-50-scaled", "full-45-scaled", "cross-21x33", "cross-40x19-scaled"],
)  # fmt: skip
def test_the_kernel_equals_the_pytorch_path(lq: int, lk: int, causal: bool, scaled: bool) -> None:
    fq, fk, v, s = kernel_inputs(2, 3, lq, lk, 8, 5)
    la, lg = _rates(3, 2)
    s = s if scaled else None
    out = decay_linear_attention_triton(
        fq, fk, v, la, lg, causal=causal, k_log_scale=s, chunk_size=16
    )
    assert out.dtype == v.dtype and out.shape == (2, 3, lq, 5)
    assert_matches(out, _ref(fq, fk, v, la, lg, s, causal=causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_padded_keys_count_nowhere_even_as_nan(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(2, 2, 45, 45, 8, 6)
    la, lg = _rates(2, 3)
    pad = padding_mask(2, 45, (0, 11)).to(DEVICE)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[1, :, 34:], v2[1, :, 34:], s2[1, :, 34:] = float("nan"), float("nan"), float("nan")
    out = decay_linear_attention_triton(
        fq, fk2, v2, la, lg, causal=causal, k_log_scale=s2, key_padding_mask=pad
    )
    assert torch.isfinite(out).all()
    assert_matches(out, _ref(fq, fk, v, la, lg, s, pad, causal=causal))


def test_causal_outputs_never_see_later_tokens() -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 50, 50, 8, 8)
    la, lg = _rates(2, 2)
    out = decay_linear_attention_triton(fq, fk, v, la, lg, causal=True, k_log_scale=s)
    fk2, v2, s2 = fk.clone(), v.clone(), s.clone()
    fk2[:, :, 30:] *= 3.0
    v2[:, :, 30:] = -v2[:, :, 30:]
    s2[:, :, 30:] += 40.0  # a later key far larger than any before: no offset may see it
    out2 = decay_linear_attention_triton(fq, fk2, v2, la, lg, causal=True, k_log_scale=s2)
    assert torch.equal(out[:, :, :30], out2[:, :, :30])
    assert not torch.allclose(out[:, :, 30:], out2[:, :, 30:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(dtype: torch.dtype) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16)
    la, lg = _rates(2, 2)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    out = decay_linear_attention_triton(fq, fk, v, la, lg, causal=True, k_log_scale=s)
    assert out.dtype == dtype
    assert_matches(out, _ref(fq, fk, v, la, lg, s, causal=True), tol=2e-2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_are_those_of_the_pytorch_path(causal: bool) -> None:
    fq, fk, v, s = kernel_inputs(1, 2, 33, 33, 8, 4)
    la, lg = _rates(2, 2)
    pad = padding_mask(1, 33, (5,)).to(DEVICE)

    def kernel(fq, fk, v, s, la, lg):
        return decay_linear_attention_triton(
            fq, fk, v, la, lg, causal=causal, k_log_scale=s, key_padding_mask=pad
        )

    def reference(fq, fk, v, s, la, lg):
        return _ref(fq, fk, v, la, lg, s, pad, causal=causal)

    assert_same_gradients(kernel, reference, [fq, fk, v, s, la, lg])


def _refusing_kernel(monkeypatch: pytest.MonkeyPatch, **options):
    """The kernel with the PyTorch path made to raise: its gradients must be the kernel's."""

    def kernel(fq, fk, v, s, la, lg):
        return decay_linear_attention_triton(fq, fk, v, la, lg, k_log_scale=s, **options)

    return refusing_reference(monkeypatch, decay_module, "decay_linear_attention", kernel)


@pytest.mark.parametrize(
    ("lq", "lk", "causal", "scaled"),
    [(70, 70, True, True), (29, 52, False, True), (41, 23, False, False)],
    ids=["causal-70", "cross-29x52", "cross-41x23-unscaled"],
)
def test_the_kernels_backward_equals_the_pytorch_paths_across_far_apart_offsets(
    lq: int, lk: int, causal: bool, scaled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gradients come from the kernel's own backward (the PyTorch path, made to raise,
    is not run), in float64 equal to the PyTorch path's with key log-scales 40 units apart
    (or none) and one rate slow, one fast, over chunks that do not divide the lengths."""
    fq, fk, v, s = (x.double() for x in kernel_inputs(2, 2, lq, lk, 8, 5, seed=3))
    s = s * 6.0 if scaled else None
    la, lg = (x.double() for x in _rates(2, 2, seed=4))
    lg[:, :, 1] = -2.5
    pad = padding_mask(2, lk, (0, 9)).to(DEVICE)
    kernel = _refusing_kernel(monkeypatch, causal=causal, key_padding_mask=pad, chunk_size=16)

    def reference(fq, fk, v, s, la, lg):
        return _ref(fq, fk, v, la, lg, s, pad, causal=causal)

    assert kernel_backward_fits(8, 5)
    if s is None:
        inputs = [fq, fk, v, la, lg]
        assert_same_gradients(
            lambda fq, fk, v, la, lg: kernel(fq, fk, v, None, la, lg),
            lambda fq, fk, v, la, lg: reference(fq, fk, v, None, la, lg),
            inputs,
            tol=1e-9,
        )
    else:
        assert_same_gradients(kernel, reference, [fq, fk, v, s, la, lg], tol=1e-9)


@pytest.mark.parametrize("wanted", [0, 2, 4], ids=["q", "v", "rates"])
def test_a_gradient_of_one_input_alone_equals_the_pytorch_paths(
    wanted: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backward runs only the scans a wanted gradient needs (here one input's)."""
    fq, fk, v, s = (x.double() for x in kernel_inputs(1, 2, 37, 37, 8, 4, seed=6))
    la, lg = (x.double() for x in _rates(2, 2, seed=7))
    inputs = [fq, fk, v, s, lg]
    leaf = inputs[wanted].detach().requires_grad_()
    inputs[wanted] = leaf
    kernel = _refusing_kernel(monkeypatch, causal=False, chunk_size=16)
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(1, 2, 37, 4, generator=g, dtype=torch.float64).to(DEVICE)
    (got,) = torch.autograd.grad((kernel(*inputs[:4], la, inputs[4]) * weight).sum(), leaf)
    cpu = on_cpu64(leaf.detach()).requires_grad_()
    ref_inputs = [on_cpu64(x.detach()) for x in inputs]
    ref_inputs[wanted] = cpu
    out = _ref(*ref_inputs[:3], on_cpu64(la), ref_inputs[4], ref_inputs[3], causal=False)
    (want,) = torch.autograd.grad((out * weight.cpu()).sum(), cpu)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_kernels_backward_of_half_inputs_is_close_to_the_exact_gradients(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half inputs: the kernel's backward (fp32 sums, the half inputs' product precision)
    close to the float64 gradients of the same rounded inputs."""
    fq, fk, v, s = kernel_inputs(1, 2, 40, 40, 16, 16, seed=9)
    fq, fk, v = (x.to(dtype) for x in (fq, fk, v))
    la, lg = _rates(2, 2, seed=10)
    kernel = _refusing_kernel(monkeypatch, causal=True)

    def reference(fq, fk, v, s, la, lg):
        return _ref(fq, fk, v, la, lg, s, causal=True)

    assert_same_gradients(kernel, reference, [fq, fk, v, s, la, lg], tol=3e-2)


def test_the_encodings_rates_get_gradients() -> None:
    bias = DecayBias(num_heads=2, decay_terms=2).to(DEVICE)
    fq, fk, v, s = kernel_inputs(1, 2, 24, 24, 8, 4)
    out = decay_linear_attention_triton(
        fq, fk, v, bias.log_alpha, bias.log_gamma(), causal=True, k_log_scale=s
    )
    out.square().sum().backward()
    got = [p.grad.clone() for p in (bias.log_alpha, bias.decay_logit)]
    exact = copy.deepcopy(bias).cpu().double()  # the PyTorch path in float64
    ref = decay_linear_attention(
        *(on_cpu64(x) for x in (fq, fk, v)), exact.log_alpha, exact.log_gamma(),
        causal=True, k_log_scale=on_cpu64(s),
    )  # fmt: skip
    ref.square().sum().backward()
    for g, p in zip(got, (exact.log_alpha, exact.decay_logit), strict=True):
        assert g[:, 0].abs().sum() > 0  # the past terms' parameters are trained
        torch.testing.assert_close(g.cpu().double(), p.grad, rtol=1e-4, atol=1e-5)


def test_refusals() -> None:
    fq, fk, v, _ = kernel_inputs(1, 2, 8, 8, 4, 4)
    la, lg = _rates(2, 2)
    with pytest.raises(ValueError, match="power of two"):
        decay_linear_attention_triton(fq, fk, v, la, lg, chunk_size=24)
    with pytest.raises(ValueError, match=r"\(H, 2, R\)"):
        decay_linear_attention_triton(fq, fk, v, la[:1], lg[:1])
    with pytest.raises(ValueError, match="Lq == Lk"):
        decay_linear_attention_triton(fq, fk[:, :, :5], v[:, :, :5], la, lg, causal=True)


def test_float64_inputs_are_summed_in_float64() -> None:
    fq, fk, v, s = (x.double() for x in kernel_inputs(1, 2, 21, 21, 4, 3))
    la, lg = (x.double() for x in _rates(2, 2))
    out = decay_linear_attention_triton(fq, fk, v, la, lg, k_log_scale=s, chunk_size=16)
    assert out.dtype == torch.float64
    assert_matches(out, _ref(fq, fk, v, la, lg, s, causal=False), tol=1e-12)
