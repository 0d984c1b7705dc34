"""The ``backend`` option of the kernelized mechanisms: with ``backend="triton"`` every
mechanism that takes it gives the outputs, gradients, prefill and decoding steps of
``backend="torch"`` (CPU tensors in Triton's interpreter, CUDA tensors on a GPU); ``"auto"``
leaves the CPU on the PyTorch path; a call the kernels do not cover falls back under
``"auto"`` and is refused with the reason under ``"triton"``; unknown values, a missing
triton and tensors the kernels cannot read are refused."""

from __future__ import annotations

import inspect

import pytest
import torch

import kattn
from kattn.registry import MECHANISMS

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.ops.triton import dispatch
from kattn.ops.triton.common import interpreted

from ..helpers import padding_mask

pytestmark = pytest.mark.skipif(
    not (interpreted() or torch.cuda.is_available()), reason="neither CUDA nor the interpreter"
)

#: where the kernels run: CPU tensors in the interpreter, else CUDA tensors.
DEVICE = "cpu" if interpreted() else "cuda"

B, H, D, DV, L, LQ = 2, 2, 8, 5, 21, 13


def _takes_backend(name: str) -> bool:
    return "backend" in inspect.signature(MECHANISMS.get(name).cls.__init__).parameters


BACKEND_MECHANISMS = [name for name in kattn.available() if _takes_backend(name)]


def _pair(name: str, **options):
    """The mechanism built with backend="triton" and "torch", the same parameters and random
    features, in evaluation mode; plain aggregator (an encoding has no kernel) and few
    features (the interpreter is slow)."""
    spec = kattn.spec(name)
    if spec.size_option:
        options.setdefault(spec.size_option, 16)
    options.setdefault("rpe", None)
    torch.manual_seed(0)
    fast = kattn.build(name, head_dim=D, num_heads=H, backend="triton", **options)
    slow = kattn.build(name, head_dim=D, num_heads=H, backend="torch", **options)
    fast, slow = fast.to(DEVICE, torch.float64), slow.to(DEVICE, torch.float64)
    slow.load_state_dict(fast.state_dict())
    return fast.eval(), slow.eval()


def _inputs(lq: int = L, lk: int = L, *, dtype=torch.float64, device=DEVICE, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, lk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, lk, DV, generator=g, dtype=torch.float64)
    return [x.to(device, dtype) for x in (q, k, v)]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_the_kernelized_mechanisms_take_the_option() -> None:
    assert {"performer", "linear", "rfa", "kernelized", "nprf_rpe", "gmm_prf", "ffk_glu"} <= set(
        BACKEND_MECHANISMS
    )
    assert not {"softmax", "rfa_gate", "simpletron"} & set(BACKEND_MECHANISMS)


@pytest.mark.parametrize("name", BACKEND_MECHANISMS)
def test_triton_equals_torch_forward_gradients_prefill_and_steps(name: str) -> None:
    fast, slow = _pair(name)
    pad = padding_mask(B, L, (0, 5)).to(DEVICE)
    cross = _inputs(LQ, L)
    _close(fast(*cross, key_padding_mask=pad), slow(*cross, key_padding_mask=pad))
    q, k, v = (x.requires_grad_() for x in _inputs())
    for module in (fast, slow):
        assert module.backend in ("triton", "torch")
    outs = [m(q, k, v, causal=True, key_padding_mask=pad) for m in (fast, slow)]
    _close(*outs)
    weight = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    grads = [
        torch.autograd.grad(
            (out * weight).sum(), (q, k, v, *module.parameters()), allow_unused=True
        )
        for out, module in zip(outs, (fast, slow), strict=True)
    ]
    for got, want in zip(*grads, strict=True):  # inputs, then the feature map's parameters
        assert (got is None) == (want is None)  # (an autoencoder's decoder is not used here)
        if got is not None:
            _close(got, want)
    with torch.no_grad():
        results = []
        for module in (fast, slow):
            out, state = module.prefill(q[:, :, :9], k[:, :, :9], v[:, :, :9])
            steps = [out]
            for t in range(9, 12):
                token = slice(t, t + 1)
                out, state = module.step(q[:, :, token], k[:, :, token], v[:, :, token], state)
                steps.append(out)
            results.append(torch.cat(steps, dim=2))
    _close(*results)
    _close(results[0], outs[1][:, :, :12].detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_inputs_through_the_kernels(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fast = kattn.build("performer", head_dim=D, num_heads=H, num_features=16, backend="triton")
    slow = kattn.build("performer", head_dim=D, num_heads=H, num_features=16, backend="torch")
    slow.load_state_dict(fast.state_dict())
    fast, slow = fast.to(DEVICE), slow.to(DEVICE)
    q, k, v = _inputs(dtype=dtype)
    for causal in (False, True):
        out = fast.eval()(q, k, v, causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()
        torch.testing.assert_close(out, slow.eval()(q, k, v, causal=causal), rtol=2e-2, atol=2e-2)


def test_auto_keeps_the_cpu_on_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran on the CPU under backend='auto'")

    for call in ("attend", "step", "prefill"):
        monkeypatch.setattr(dispatch.TritonLinearAggregator, call, refuse)
    attn = kattn.build("performer", head_dim=D, num_heads=H, num_features=16).eval()
    assert attn.backend == "auto"
    q, k, v = _inputs(dtype=torch.float32, device="cpu")
    attn(q, k, v, causal=True)
    _, state = attn.prefill(q, k, v)
    attn.step(q[:, :, :1], k[:, :, :1], v[:, :, :1], state)


def test_default_builds_are_unchanged() -> None:
    for name in BACKEND_MECHANISMS:
        attn = kattn.build(name, head_dim=D, num_heads=H, max_len=64)
        assert attn.backend == "auto" and "backend" not in repr(attn)
        spec = kattn.spec(name)
        assert attn.supports_recurrent is spec.supports_recurrent


def test_unknown_values_are_value_errors() -> None:
    for bad in ("cuda", "Triton", None, 1):
        with pytest.raises(ValueError, match="backend must be one of 'auto', 'triton', 'torch'"):
            kattn.build("performer", head_dim=D, num_heads=H, backend=bad)


def test_an_encoding_falls_back_on_auto_and_is_refused_on_triton() -> None:
    with pytest.raises(NotImplementedError, match=r"ToeplitzBias.*rpe=None"):
        kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=32, backend="triton")
    with pytest.raises(NotImplementedError, match="DecayBias"):
        kattn.build("performer", head_dim=D, num_heads=H, rpe="decay", backend="triton")
    torch.manual_seed(0)
    auto = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=32, num_features=16).eval()
    torch.manual_seed(0)
    torch_path = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=32, num_features=16,
                             backend="torch").eval()  # fmt: skip
    q, k, v = _inputs(dtype=torch.float32, device="cpu")
    assert torch.equal(auto(q, k, v, causal=True), torch_path(q, k, v, causal=True))


def test_calls_the_kernels_do_not_cover_are_refused_with_the_reason() -> None:
    torch.manual_seed(0)
    attn = kattn.build("linear", head_dim=D, num_heads=H, chunk_size=24, backend="triton")
    q, k, v = _inputs(dtype=torch.float32)
    attn(q, k, v)  # the non-causal kernels have no chunks
    with pytest.raises(NotImplementedError, match=r"chunk_size in .* has 24"):
        attn(q, k, v, causal=True)
    attn = kattn.build("linear", head_dim=D, num_heads=H, backend="triton")
    state = attn.init_state(B, H, device=DEVICE)
    grad_q = q[:, :, :1].clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="step has no backward"):
        attn.step(grad_q, k[:, :, :1], v[:, :, :1], state)
    with pytest.raises(NotImplementedError, match="prefill has no backward"):
        attn.prefill(q.requires_grad_(), k, v)
    auto = kattn.build("linear", head_dim=D, num_heads=H, chunk_size=24)
    auto(q, k, v, causal=True)  # auto: the PyTorch path


def test_triton_refuses_tensors_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    attn = kattn.build("linear", head_dim=D, num_heads=H, backend="triton")
    q, k, v = _inputs(dtype=torch.float32, device="cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA tensors, or on CPU tensors with TRITON_INTERPRET"):
        attn(q, k, v)
    meta = [x.to("meta") for x in (q, k, v)]
    with pytest.raises(ValueError, match="got meta tensors"):
        attn(*meta)


def test_triton_without_triton_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_importable", lambda: False)
    attn = kattn.build("linear", head_dim=D, num_heads=H, backend="triton")
    with pytest.raises(ImportError, match=r"kattn\[gpu\]"):
        attn(*_inputs(dtype=torch.float32))
    auto = kattn.build("linear", head_dim=D, num_heads=H)
    assert torch.isfinite(auto(*_inputs(dtype=torch.float32, device="cpu"))).all()


@pytest.mark.parametrize("name", ["performer", "rfa"])
def test_a_row_with_every_key_padded_stays_finite(name: str) -> None:
    fast, _ = _pair(name)
    q, k, v = (x.float().requires_grad_() for x in _inputs())
    pad = torch.zeros(B, L, dtype=torch.bool, device=DEVICE)
    pad[1] = True
    for causal in (False, True):
        out = fast.float()(q, k, v, causal=causal, key_padding_mask=pad)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert torch.isfinite(out).all() and (out[1] == 0).all()
        assert all(torch.isfinite(g).all() for g in grads)
