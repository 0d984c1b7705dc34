"""The ``backend`` option of the kernelized mechanisms: with ``backend="triton"`` every
mechanism that takes it gives the outputs, gradients, prefill and decoding steps of
``backend="torch"`` (CPU tensors in Triton's interpreter, CUDA tensors on a GPU); ``"auto"``
leaves the CPU on the PyTorch path; a call the kernels do not cover falls back under
``"auto"`` and is refused with the reason under ``"triton"``; unknown values, a missing
triton and tensors the kernels cannot read are refused. The relative positional encodings:
test_triton_rpe_backend.py."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import kattn
from kattn.registry import MECHANISMS

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.ops.triton import dispatch

from ..helpers import padding_mask, step_through
from .backend_pairs import LQ, B, D, H, L, close, close_gradients, gradients, inputs, pair
from .kernel_device import DEVICE, needs_kernels

pytestmark = needs_kernels


def _takes_backend(name: str) -> bool:
    return "backend" in inspect.signature(MECHANISMS.get(name).cls.__init__).parameters


BACKEND_MECHANISMS = [name for name in kattn.available() if _takes_backend(name)]


def test_the_kernelized_mechanisms_take_the_option() -> None:
    assert {"performer", "linear", "rfa", "kernelized", "nprf_rpe", "gmm_prf", "ffk_glu"} <= set(
        BACKEND_MECHANISMS
    )
    assert not {"softmax", "rfa_gate", "simpletron"} & set(BACKEND_MECHANISMS)


@pytest.mark.parametrize("name", BACKEND_MECHANISMS)
def test_triton_equals_torch_forward_gradients_prefill_and_steps(name: str) -> None:
    fast, slow = pair(name)
    pad = padding_mask(B, L, (0, 5)).to(DEVICE)
    cross = inputs(LQ, L)
    close(fast(*cross, key_padding_mask=pad), slow(*cross, key_padding_mask=pad))
    q, k, v = (x.requires_grad_() for x in inputs())
    for module in (fast, slow):
        assert module.backend in ("triton", "torch")
    outs = [m(q, k, v, causal=True, key_padding_mask=pad) for m in (fast, slow)]
    close(*outs)
    # inputs, then the feature map's parameters (an autoencoder's decoder is not used here)
    close_gradients(*gradients(outs, (fast, slow), (q, k, v)))
    with torch.no_grad():
        results = []
        for module in (fast, slow):
            head, state = module.prefill(q[:, :, :9], k[:, :, :9], v[:, :, :9])
            twelve = (q[:, :, :12], k[:, :, :12], v[:, :, :12])
            tail, _ = step_through(module.step, *twelve, state, start=9)
            results.append(torch.cat([head, tail], dim=2))
    close(*results)
    close(results[0], outs[1][:, :, :12].detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_inputs_through_the_kernels(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fast = kattn.build("performer", head_dim=D, num_heads=H, num_features=16, backend="triton")
    slow = kattn.build("performer", head_dim=D, num_heads=H, num_features=16, backend="torch")
    slow.load_state_dict(fast.state_dict())
    fast, slow = fast.to(DEVICE), slow.to(DEVICE)
    q, k, v = inputs(dtype=dtype)
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
    q, k, v = inputs(dtype=torch.float32, device="cpu")
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


def test_calls_the_kernels_do_not_cover_are_refused_with_the_reason() -> None:
    torch.manual_seed(0)
    attn = kattn.build("linear", head_dim=D, num_heads=H, chunk_size=24, backend="triton")
    q, k, v = inputs(dtype=torch.float32)
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


def test_triton_refuses_fp64_states_beyond_the_sizes_checked_in_fp64() -> None:
    from kattn.ops.triton.sizes import MAX_FP64_FEATURES, MAX_FP64_VALUES

    def built(num_features: int, **options):
        torch.manual_seed(0)
        attn = kattn.build(
            "performer", head_dim=D, num_heads=H, num_features=num_features, backend="triton",
            **options,
        )  # fmt: skip
        return attn.to(DEVICE, torch.float64).eval()

    q, k, v = inputs()
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(B, H, L, MAX_FP64_VALUES + 1, generator=g, dtype=torch.float64)
    refused = rf"fp64 .* M <= {MAX_FP64_FEATURES} features and Dv <= {MAX_FP64_VALUES}"
    many = MAX_FP64_FEATURES + 1
    with pytest.raises(NotImplementedError, match=refused + rf".* M = {many} and Dv = 5"):
        built(many)(q, k, v)
    with pytest.raises(NotImplementedError, match=refused):
        built(16)(q, k, wide.to(DEVICE), causal=True)
    with pytest.raises(NotImplementedError, match=refused), torch.no_grad():
        built(many).prefill(q, k, v)
    with pytest.raises(NotImplementedError, match=refused):
        built(many, rpe="decay")(q, k, v)
    assert torch.isfinite(built(MAX_FP64_FEATURES)(q, k, v, causal=True)).all()
    assert torch.isfinite(built(many)(*(x.float() for x in (q, k, v)))).all()  # fp32 fits


def test_triton_refuses_tensors_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    attn = kattn.build("linear", head_dim=D, num_heads=H, backend="triton")
    q, k, v = inputs(dtype=torch.float32, device="cpu")
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
        attn(*inputs(dtype=torch.float32))
    auto = kattn.build("linear", head_dim=D, num_heads=H)
    assert torch.isfinite(auto(*inputs(dtype=torch.float32, device="cpu"))).all()


@pytest.mark.parametrize("name", ["performer", "rfa"])
def test_a_row_with_every_key_padded_stays_finite(name: str) -> None:
    fast, _ = pair(name)
    q, k, v = (x.float().requires_grad_() for x in inputs())
    pad = torch.zeros(B, L, dtype=torch.bool, device=DEVICE)
    pad[1] = True
    for causal in (False, True):
        out = fast.float()(q, k, v, causal=causal, key_padding_mask=pad)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert torch.isfinite(out).all() and (out[1] == 0).all()
        assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    ("call", "causal"), [("attend", True), ("attend", False), ("prefill", True)]
)
def test_auto_keeps_shapes_beyond_the_checked_sizes_on_the_pytorch_path(
    call: str, causal: bool
) -> None:
    """On CUDA (``x`` stands for a CUDA tensor: only its device and dtype are read), ``"auto"``
    sends an attend or prefill whose state exceeds the checked sizes to the PyTorch path and
    one within them to the kernels; ``"triton"`` runs the kernels as asked."""
    from kattn.aggregator import LinearAggregator
    from kattn.ops.triton.sizes import MAX_KERNEL_FEATURES, MAX_KERNEL_VALUES

    plain = LinearAggregator(num_heads=2)
    cuda = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)

    def chosen(backend: str, m: int, dv: int):
        fq, fk = torch.zeros(2, 1, 2, 9, m)
        v = torch.zeros(1, 2, 9, dv)
        return dispatch.select_aggregator(
            backend, plain, cuda, call=call, causal=causal, features=(fq, fk, v)
        )

    assert chosen("auto", MAX_KERNEL_FEATURES + 1, 4) is plain
    assert chosen("auto", 8, MAX_KERNEL_VALUES + 1) is plain
    fits = chosen("auto", MAX_KERNEL_FEATURES, MAX_KERNEL_VALUES)
    assert isinstance(fits, dispatch.TritonLinearAggregator)
    asked = chosen("triton", MAX_KERNEL_FEATURES + 1, MAX_KERNEL_VALUES + 1)
    assert isinstance(asked, dispatch.TritonLinearAggregator)
