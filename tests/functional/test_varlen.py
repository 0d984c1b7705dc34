"""Packed documents as a padded batch and back (kattn.functional.varlen)."""

from __future__ import annotations

import pytest
import torch

from kattn.functional.varlen import check_cu_seqlens, pad_packed, unpad_to_packed


def _packed(total: int, *, dv: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, total, dv, generator=g, dtype=torch.float64)


def test_pad_puts_each_document_in_a_row_from_position_zero() -> None:
    x = _packed(12)
    (padded,), padding = pad_packed([0, 3, 3, 10, 12], x)
    assert padded.shape == (4, 2, 7, 3)
    assert padding.tolist() == [
        [False] * 3 + [True] * 4,
        [True] * 7,
        [False] * 7,
        [False] * 2 + [True] * 5,
    ]
    assert torch.equal(padded[0, :, :3], x[0, :, 0:3])
    assert torch.equal(padded[2], x[0, :, 3:10])
    assert torch.equal(padded[3, :, :2], x[0, :, 10:12])
    assert not padded[padding[:, None, :, None].expand_as(padded)].any()  # zeros where padded
    assert torch.equal(unpad_to_packed(padded, padding), x)


def test_no_gradient_reaches_a_token_through_a_padded_slot() -> None:
    x = _packed(5).requires_grad_(True)
    (padded,), _ = pad_packed(torch.tensor([0, 1, 5]), x)
    padded.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # each token once, from its own slot


@pytest.mark.parametrize(
    ("cu", "match"),
    [
        ([0], "at least two"),
        ([[0, 4]], "1-D"),
        ([1, 4], "start at 0"),
        ([0, 3, 2, 4], "never decrease"),
        ([0, 3], "end at the packed length T=4"),
        (torch.tensor([0.0, 4.0]), "integers"),
        ("04", "sequence of ints"),
    ],
)
def test_bad_cumulative_lengths_are_refused(cu, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_cu_seqlens(cu, 4)


def test_several_tensors_share_the_rows_and_documents_can_be_chosen() -> None:
    k, v = _packed(12, dv=4), _packed(12, seed=1)
    (pk, pv), padding = pad_packed([0, 3, 3, 10, 12], k, v, documents=torch.tensor([3, 0]))
    assert pk.shape == (2, 2, 3, 4) and pv.shape == (2, 2, 3, 3)  # L_max of the kept ones
    assert padding.tolist() == [[False, False, True], [False, False, False]]
    assert torch.equal(pk[0, :, :2], k[0, :, 10:12]) and torch.equal(pv[1], v[0, :, 0:3])


def test_packed_tensors_must_be_one_row_of_one_length() -> None:
    with pytest.raises(ValueError, match=r"\(1, H, T, ·\)"):
        pad_packed([0, 4], torch.zeros(2, 1, 4, 3))
    with pytest.raises(ValueError, match="same T"):
        pad_packed([0, 4], torch.zeros(1, 1, 4, 3), torch.zeros(1, 1, 5, 3))
