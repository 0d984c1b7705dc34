"""Packed sequences in transformers models (``kattn.hf.packing``): documents laid end to end
with position ids that restart at each one, as ``DataCollatorWithFlattening`` makes them."""

from __future__ import annotations

import pytest
import torch

from ..helpers import assert_close
from .tiny_models import VOCAB, make

hf = pytest.importorskip("kattn.hf")


def _documents(lengths: list[list[int]], *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``(B, L)`` and position ids restarting at each document of each row."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths[0])
    ids = torch.randint(3, VOCAB, (len(lengths), total), generator=g)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    return ids, positions


def _alone(model, ids: torch.Tensor, lengths: list[list[int]]) -> torch.Tensor:
    rows = []
    for b, row in enumerate(lengths):
        starts = [sum(row[:i]) for i in range(len(row))]
        alone = [model(ids[b : b + 1, s : s + n]).logits for s, n in zip(starts, row, strict=True)]
        rows.append(torch.cat(alone, 1))
    return torch.cat(rows)


@pytest.mark.parametrize("mechanism", ["performer", "softmax", "nprf_rpe"])
def test_packed_rows_give_each_document_its_own_logits(mechanism: str) -> None:
    model = hf.use(make("llama"), mechanism)
    lengths = [[4, 8], [7, 1, 4]]
    ids, positions = _documents(lengths)
    packed = model(ids, position_ids=positions, use_cache=False).logits
    assert_close(packed, _alone(model, ids, lengths), torch.float32)


def test_flash_attention_document_lengths_are_taken_too() -> None:
    model = hf.use(make("llama"), "performer")
    lengths = [[5, 9, 3]]
    ids, positions = _documents(lengths)
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    packed = model(
        ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9,
        max_length_k=9,
    ).logits  # fmt: skip
    assert_close(packed, _alone(model, ids, lengths), torch.float32)
    padded = torch.ones(1, 17, dtype=torch.long)
    padded[0, -2:] = 0
    with pytest.raises(NotImplementedError, match="does not agree with the packed documents"):
        model(ids, attention_mask=padded, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_a_cache_that_read_packed_documents_refuses_to_decode() -> None:
    model = hf.use(make("llama"), "performer")
    ids, positions = _documents([[5, 9, 3]])
    cu = torch.tensor([0, 5, 14, 17])
    cache = hf.RecurrentCache()
    model(ids, position_ids=positions, cu_seq_lens_q=cu, past_key_values=cache, use_cache=True)
    with pytest.raises(NotImplementedError, match="packed documents"):
        model(ids[:, :1], past_key_values=cache, use_cache=True)


def test_masks_that_only_look_packed_are_still_refused() -> None:
    model = hf.use(make("llama"), "performer")
    ids, positions = _documents([[6, 6]])
    blocks = torch.zeros(12, 12, dtype=torch.bool)
    blocks[:6, :6] = blocks[6:, 6:] = True  # documents, but not causal inside them
    with pytest.raises(NotImplementedError, match="not causal attention"):
        model(ids, attention_mask=blocks[None, None])
    causal_blocks = blocks & torch.ones(12, 12, dtype=torch.bool).tril()
    packed = model(ids, attention_mask=causal_blocks[None, None], position_ids=positions).logits
    assert_close(packed, _alone(model, ids, [[6, 6]]), torch.float32)
