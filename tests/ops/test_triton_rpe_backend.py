"""``backend="triton"`` with a relative positional encoding that has kernels (DecayBias
``"recurrent"``, BucketedBias ``"banded"``, the 1-D ToeplitzBias ``"auto"``/``"dense"``):
nprf_rpe gives the outputs of ``backend="torch"`` and the gradients of q, k, v and of the
encoding's parameters (float64, CPU tensors in Triton's interpreter); encodings without a
kernel are refused at construction under ``"triton"``, decoding steps are refused there and
fall back under ``"auto"``, and the CPU stays on the PyTorch path under ``"auto"``."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

import kattn

pytest.importorskip("triton", reason="the Triton kernels are tested where triton is installed")

from kattn.ops.triton import dispatch

from ..helpers import padding_mask
from .backend_pairs import LQ, B, D, H, L, close, close_gradients, gradients, inputs, pair
from .kernel_device import DEVICE, needs_kernels

pytestmark = needs_kernels

ENCODINGS = {
    "decay": dict(rpe="decay", decay_terms=2),
    "bucketed": dict(rpe="bucketed", num_buckets=8, max_distance=12),
    "toeplitz": dict(rpe="toeplitz", max_len=32),
    "toeplitz-dense": dict(rpe="toeplitz", max_len=32, rpe_method="dense"),
}


def _encoded_pair(name: str):
    """nprf_rpe with encoding ``name``, its parameters moved off their initial values."""
    fast, slow = pair("nprf_rpe", **ENCODINGS[name])
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in fast.rpe.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    slow.load_state_dict(fast.state_dict())
    return fast, slow


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_triton_equals_torch_outputs_and_gradients(name: str, causal: bool) -> None:
    fast, slow = _encoded_pair(name)
    q_in = inputs(L if causal else LQ, L)
    q, k, v = (x.requires_grad_() for x in q_in)
    pad = padding_mask(B, L, (0, 5)).to(DEVICE)
    assert isinstance(fast._aggregator_for(v, "attend"), dispatch.TritonEncodingAggregator)
    outs = [m(q, k, v, causal=causal, key_padding_mask=pad) for m in (fast, slow)]
    close(*outs)
    got, want = gradients(outs, (fast, slow), (q, k, v))
    assert sum(g.abs().sum() for g in got[3:] if g is not None) > 0  # the encoding learns
    close_gradients(got, want)


def test_the_kernel_aggregator_is_made_once_per_encoding_and_lets_it_go() -> None:
    fast, _ = _encoded_pair("decay")
    v = inputs()[2]
    chosen = fast._aggregator_for(v, "attend")
    assert isinstance(chosen, dispatch.TritonEncodingAggregator) and chosen.encoding is fast.rpe
    assert fast._aggregator_for(v, "attend") is chosen
    other, _ = _encoded_pair("bucketed")
    assert other._aggregator_for(v, "attend").encoding is other.rpe
    gone = weakref.ref(fast.rpe)
    del fast
    gc.collect()
    assert gone() is None
    with pytest.raises(RuntimeError, match="no longer exists"):
        _ = chosen.encoding


def test_encodings_without_a_kernel_are_refused_at_construction() -> None:
    build = dict(head_dim=D, num_heads=H, backend="triton")
    with pytest.raises(NotImplementedError, match="Toeplitz2dBias has no Triton kernel"):
        kattn.build("nprf_rpe", rpe="toeplitz2d", grid=(4, 4), **build)
    with pytest.raises(NotImplementedError, match=r"'dense' or 'auto', this module has 'fft'"):
        kattn.build("nprf_rpe", max_len=32, rpe_method="fft", **build)
    with pytest.raises(NotImplementedError, match=r"'recurrent', this module has 'dense'"):
        kattn.build("performer", rpe="decay", rpe_method="dense", **build)
    kattn.build("nprf_rpe", rpe="toeplitz2d", grid=(4, 4), head_dim=D, num_heads=H)  # auto


def test_decoding_with_an_encoding_is_refused_on_triton_and_falls_back_on_auto() -> None:
    fast, _ = _encoded_pair("decay")
    q, k, v = inputs()
    state = fast.init_state(B, H, device=DEVICE, dtype=torch.float64)
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match=r"step of DecayBias .* attend only"):
            fast.step(q[:, :, :1], k[:, :, :1], v[:, :, :1], state)
        with pytest.raises(NotImplementedError, match="prefill of DecayBias"):
            fast.prefill(q, k, v)
    gap = dispatch.kernel_gap(fast.rpe, call="step")
    cuda = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)
    assert gap is not None and not dispatch.use_triton("auto", gap, cuda)  # type: ignore[arg-type]
    covered = dispatch.kernel_gap(fast.rpe, call="attend")
    assert covered is None and dispatch.use_triton("auto", covered, cuda)  # type: ignore[arg-type]


def test_auto_keeps_the_cpu_on_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran on the CPU under backend='auto'")

    monkeypatch.setattr(dispatch, "rpe_attend_triton", refuse)
    attn = kattn.build("nprf_rpe", head_dim=D, num_heads=H, rpe="bucketed", num_features=16)
    q, k, v = inputs(dtype=torch.float32, device="cpu")
    assert torch.isfinite(attn.eval()(q, k, v, causal=True)).all()


def test_auto_keeps_the_fft_where_the_encoding_would_choose_it(monkeypatch):
    """Under ``"auto"`` on CUDA (``x`` stands for a CUDA tensor: only its device and dtype are
    read), a Toeplitz encoding of method ``"auto"`` whose own choice is the FFT (long
    sequences) keeps its own ``attend`` (the FFT), not the exact O(L²) kernel, and so does a
    state beyond the checked sizes; where it would choose the exact form the kernel runs, and
    ``"triton"`` runs the kernel as asked."""
    from kattn.ops.triton.sizes import MAX_KERNEL_FEATURES

    attn = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=32, rpe="toeplitz")
    encoding = attn.rpe
    choice = ["fft"]
    calls: list[str] = []
    monkeypatch.setattr(type(encoding), "_auto_method", lambda *a: choice[0])
    monkeypatch.setattr(dispatch, "rpe_attend_triton", lambda *a, **k: calls.append("kernel"))
    g = torch.Generator().manual_seed(0)
    phi_q, phi_k = torch.rand(2, B, H, L, 8, generator=g)
    v = torch.randn(B, H, L, D, generator=g)
    cuda = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)

    def chosen(backend: str, features=(phi_q, phi_k, v)):
        return dispatch.select_aggregator(backend, encoding, cuda, call="attend", features=features)

    assert chosen("auto") is encoding
    chosen("triton").attend(phi_q, phi_k, v)
    assert calls == ["kernel"]
    choice[0] = "dense"
    chosen("auto").attend(phi_q, phi_k, v)
    assert calls == ["kernel", "kernel"]
    wide = torch.rand(B, H, L, MAX_KERNEL_FEATURES + 1, generator=g)
    assert chosen("auto", (wide, wide, v)) is encoding
