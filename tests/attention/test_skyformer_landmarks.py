"""Skyformer's landmarks in eval(): an example's output depends on the example alone, not on
the batch it is in, and the module's state reproduces it."""

import pytest
import torch

import kattn

from ..helpers import assert_close, padding_mask


def batch_inputs(b=4, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, 2, length, 16, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("init", ["identity", "per_matrix"])  # "global": one scale per batch
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "mask"])
def test_eval_output_of_an_example_does_not_depend_on_its_batch(padded, init):
    options = {"num_landmarks": 16, "pinv_init": init}
    attn = kattn.build("skyformer", head_dim=16, num_heads=2, **options).eval()
    q, k, v = batch_inputs()
    mask = padding_mask(4, 40, (0, 5, 11, 2)) if padded else None
    alone = []
    for i in range(4):
        row = None if mask is None else mask[i : i + 1]
        alone.append(attn(q[i : i + 1], k[i : i + 1], v[i : i + 1], key_padding_mask=row))
    for order in ([1, 0], [3, 1], [0, 1, 2, 3], [2, 3, 1, 0]):
        rows = torch.tensor(order)
        out = attn(q[rows], k[rows], v[rows], key_padding_mask=None if mask is None else mask[rows])
        for place, i in enumerate(order):
            assert_close(out[place : place + 1], alone[i])


def test_eval_landmarks_are_one_draw_shared_by_the_examples():
    attn = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=16).eval()
    index, _ = attn.landmarks(3, 40, 40, None, "cpu")
    assert torch.equal(index[0], index[1]) and torch.equal(index[0], index[2])
    assert torch.equal(index[:1], attn.landmarks(1, 40, 40, None, "cpu")[0])
    attn.train()  # training draws afresh for every example
    index, _ = attn.landmarks(3, 40, 40, None, "cpu")
    assert not torch.equal(index[0], index[1])


def test_state_dict_round_trip_reproduces_eval_outputs():
    torch.manual_seed(1)
    first = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=16).eval()
    torch.manual_seed(2)
    second = kattn.build("skyformer", head_dim=16, num_heads=2, num_landmarks=16).eval()
    q, k, v = batch_inputs(b=2)
    assert not torch.equal(first(q, k, v), second(q, k, v))  # another seed, other landmarks
    second.load_state_dict(first.state_dict())
    assert torch.equal(first(q, k, v), second(q, k, v))
