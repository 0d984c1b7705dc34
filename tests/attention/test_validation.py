"""Bad input raises an error that names the argument and says what was expected."""

import pytest
import torch

import kattn

from ..helpers import qkv

D, H = 16, 3


@pytest.fixture(params=kattn.available())
def attn(request):
    torch.manual_seed(0)
    return kattn.build(request.param, head_dim=D, num_heads=H, max_len=64)


def refused(attn, match, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        attn(*args, **kwargs)


def test_shapes_dtypes_and_masks_are_checked(attn):
    q, k, v = qkv(d=D, dtype=torch.float32)
    refused(attn, r"q must be 4-D \(B, H, L, D\)", q[0], k, v)
    refused(attn, "batch sizes differ", q, k[:1], v[:1])
    refused(attn, "head counts differ", q, k[:, :2], v[:, :2])
    refused(attn, "num_heads=3", q[:, :2], k[:, :2], v[:, :2])
    refused(attn, "same length", q, k, v[:, :, :-1])
    refused(attn, "same head dim", q, k[..., :-1], v)
    refused(attn, "head_dim=16", q[..., :-1], k[..., :-1], v)
    refused(attn, "floating", q.long(), k.long(), v.long())
    refused(attn, "share a dtype", q, k.double(), v)
    refused(attn, "must be a torch.Tensor", q.tolist(), k, v)
    refused(attn, "causal must be a bool", q, k, v, causal=1)
    refused(attn, "at least one position", q[:, :, :0], k, v)
    refused(attn, "at least one position", q, k[:, :, :0], v[:, :, :0])
    if attn.supports_padding_mask:
        refused(
            attn, r"key_padding_mask must be a bool", q, k, v, key_padding_mask=torch.zeros(2, 37)
        )
        refused(
            attn,
            r"key_padding_mask must have shape \(B, Lk\) = \(2, 37\)",
            q,
            k,
            v,
            key_padding_mask=torch.zeros(2, 36, dtype=torch.bool),
        )
    if attn.supports_causal:
        q2, k2, v2 = qkv(lq=5, lk=9, d=D, dtype=torch.float32)
        refused(attn, "causal attention needs Lq == Lk", q2, k2, v2, causal=True)


def test_recurrent_api_checks(attn):
    q, k, v = qkv(lq=2, d=D, dtype=torch.float32)
    if not attn.supports_recurrent:
        with pytest.raises(NotImplementedError, match="no recurrent form"):
            attn.init_state(2, H)
        return
    with pytest.raises(ValueError, match="num_heads"):
        attn.init_state(2, H + 1)
    with pytest.raises(ValueError, match="batch_size"):
        attn.init_state(0, H)
    state = attn.init_state(2, H)
    with pytest.raises(ValueError, match="one token"):
        attn.step(q, k, v, state)
    with pytest.raises(ValueError, match="state"):
        attn.step(q[:, :, :1], k[:, :, :1], v[:, :, :1], "not a state")


def test_mechanisms_without_a_recurrent_form_refuse_to_decode():
    class NoRecurrence(kattn.Attention):
        supports_recurrent = False

    attn = NoRecurrence(head_dim=D, num_heads=H)
    q, k, v = qkv(lq=1, d=D, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="no recurrent form"):
        attn.init_state(2, H)
    with pytest.raises(NotImplementedError, match="no recurrent form"):
        attn.step(q, k, v, None)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_an_empty_batch_gives_an_empty_output(attn, causal):
    if causal and not attn.supports_causal:
        pytest.skip("no causal form")
    q, k, v = qkv(b=0, h=H, lq=9, d=D, dtype=torch.float32, requires_grad=True)
    mask = torch.zeros(0, 9, dtype=torch.bool) if attn.supports_padding_mask else None
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    assert out.shape == (0, H, 9, v.shape[-1])
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_step_refuses_a_state_of_another_batch_size(attn):
    if not attn.supports_recurrent:
        pytest.skip("no recurrent form")
    q, k, v = qkv(b=3, h=H, lq=1, d=D, dtype=torch.float32)
    with pytest.raises(ValueError, match="state"):
        attn.step(q[:2], k[:2], v[:2], attn.init_state(3, H))
    _, state = attn.step(q, k, v, attn.init_state(3, H))  # a state that holds a token
    with pytest.raises(ValueError, match="state"):
        attn.step(q[:2], k[:2], v[:2], state)
