"""Extra state as tensors (:mod:`kattn.extra_state`): every mechanism's ``state_dict()`` holds
only tensors, so safetensors saves and restores it as it is; checkpoints written when the
extra state was a dict still load; malformed states and seeds an int64 cannot hold are
refused."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.extra_state import counters_from_state, counters_to_tensor

from .helpers import qkv

H, D, L = 2, 8, 24


def _build(name: str, **options) -> kattn.Attention:
    return kattn.build(name, head_dim=D, num_heads=H, max_len=64, **options)


@pytest.mark.parametrize("name", kattn.available())
def test_state_dict_round_trips_through_safetensors(name, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    source = _build(name)
    state = source.state_dict()
    assert all(isinstance(value, torch.Tensor) for value in state.values())
    safetensors.save_file(state, tmp_path / "model.safetensors")
    torch.manual_seed(1)
    target = _build(name)
    target.load_state_dict(safetensors.load_file(tmp_path / "model.safetensors"))
    for key, value in state.items():
        assert torch.equal(target.state_dict()[key], value), key


def _old_form(state: dict, names: list[str]) -> dict:
    """``state`` with its extra states as the dicts that checkpoints used to hold."""
    old = dict(state)
    for key in [key for key in state if key.endswith("_extra_state")]:
        old[key] = dict(zip(names, state[key].tolist(), strict=True))
    return old


@pytest.mark.parametrize(
    ("name", "options", "names"),
    [
        ("performer", {"redraw": 3}, ["steps_since_redraw"]),
        ("reformer", {"bucket_size": 4}, ["seed", "draws"]),
    ],
)
def test_a_checkpoint_with_the_old_dict_extra_state_loads(name, options, names, tmp_path):
    """Saved with ``torch.save`` as the extra state used to be; the loaded module continues
    the redraw schedule (reformer: the seed and the draw sequence) where the saved one
    stopped."""
    torch.manual_seed(0)
    q, k, v = qkv(1, H, L, d=D)
    seed = {"seed": 7} if "seed" in names else {}
    source = _build(name, **options, **seed).double().train()
    source(q, k, v), source(q, k, v)
    torch.save(_old_form(source.state_dict(), names), tmp_path / "old.pt")
    old = torch.load(tmp_path / "old.pt", weights_only=True)
    assert isinstance(old[next(key for key in old if key.endswith("_extra_state"))], dict)
    target = _build(name, **options).double().train()
    target.load_state_dict(old)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    torch.manual_seed(5)
    expected = source(q, k, v)  # performer: the third forward, which redraws
    torch.manual_seed(5)
    assert torch.equal(target(q, k, v), expected)


def test_counters_round_trip_and_malformed_states_are_refused():
    assert counters_from_state(counters_to_tensor([3, 0]), ["seed", "draws"]) == (3, 0)
    assert counters_from_state({"draws": 2, "seed": 5}, ["seed", "draws"]) == (5, 2)
    for state in (
        torch.tensor([1.0, 2.0]),  # not int64
        torch.tensor([1]),  # a counter missing
        torch.tensor([1, -2]),  # negative
        {"seed": 1, "draws": True},
        {"seed": 1, "draws": 2, "other": 3},
        [1, 2],
    ):
        with pytest.raises(ValueError, match=r"int64 tensor of \[seed, draws\]"):
            counters_from_state(state, ["seed", "draws"])


def test_a_seed_an_int64_cannot_hold_is_refused():
    with pytest.raises(ValueError, match=r"seed must be below 2\*\*63"):
        _build("reformer", seed=2**63)
    assert _build("reformer", seed=2**63 - 1).get_extra_state().tolist() == [2**63 - 1, 0]
