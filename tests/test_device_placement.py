"""Device placement without a GPU: every mechanism's forward, backward and decoding step run
with the module and its inputs on the ``meta`` device, so a tensor made on the CPU behind the
inputs' back (a missing ``device=``) fails here when an elementwise op, ``cat``, ``where`` or
``masked_fill`` mixes it with the inputs (on this PyTorch, matrix products and gathers with a
CPU operand do not raise on ``meta``, so this catches most such slips, not all).

A few mechanisms read values of their index tables or hashes to check or size them (a host
sync on CUDA, impossible on ``meta``); they are listed with that reason, and the test checks
that the first thing that stops them is such a read."""

from __future__ import annotations

import pytest
import torch

import kattn

#: mechanisms that read tensor values (validation of their block tables, the set of global
#: positions, the largest hash) and so cannot run on ``meta``.
READS_VALUES = {
    "bigbird": "checks its block table's values",
    "local": "checks its block table's values",
    "sparse_transformer": "checks its block table's values",
    "longformer": "sorts its global positions with torch.unique",
    "reformer": "reads the largest bucket to sort padding last",
}
VALUE_READS = ("Tensor.item() cannot be called on meta tensors", "aten::_unique2")


def _qkv(requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.randn(2, 2, 24, 16, device="meta", requires_grad=requires_grad) for _ in range(3)
    )


@pytest.mark.parametrize("name", kattn.available())
def test_forward_and_backward_stay_on_the_inputs_device(name: str) -> None:
    attn = kattn.build(name, head_dim=16, num_heads=2, max_len=24).to("meta")
    q, k, v = _qkv()
    if name in READS_VALUES:
        with pytest.raises((RuntimeError, NotImplementedError)) as caught:
            attn(q, k, v)
        assert any(reason in str(caught.value) for reason in VALUE_READS), caught.value
        return
    for causal in sorted({False, attn.supports_causal}):
        q.grad = None
        out = attn(q, k, v, causal=causal)
        assert out.device.type == "meta" and out.shape == (2, 2, 24, 16)
        out.sum().backward()
        assert q.grad is not None and q.grad.device.type == "meta"


@pytest.mark.parametrize("name", [n for n in kattn.available() if kattn.spec(n).supports_recurrent])
def test_decoding_steps_stay_on_the_inputs_device(name: str) -> None:
    if name in READS_VALUES:
        pytest.skip(READS_VALUES[name])
    attn = kattn.build(name, head_dim=16, num_heads=2, max_len=24).to("meta").eval()
    state = attn.init_state(2, 2, device="meta", dtype=torch.float32)
    q, k, v = _qkv(requires_grad=False)
    for t in range(3):
        out, state = attn.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        assert out.device.type == "meta" and out.shape == (2, 2, 1, 16)
