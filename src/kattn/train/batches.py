"""Batches of a run: which examples make global batch ``s`` (a function of the seed and ``s``
alone, so resumed runs take the same steps), and the tensors of a batch on the device."""

from __future__ import annotations

import torch
from torch import Tensor

from ..data import ImageData, SequenceDataset, TaskData


class BatchOrder:
    """The training examples of each global batch: one seeded permutation per epoch, read in
    order, so batch ``s`` is a function of the seed and ``s`` alone."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self._epochs: dict[int, Tensor] = {}

    def _epoch(self, epoch: int) -> Tensor:
        if epoch not in self._epochs:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epochs = {k: v for k, v in self._epochs.items() if k >= epoch - 1}
            self._epochs[epoch] = torch.randperm(self.size, generator=generator)
        return self._epochs[epoch]

    def __call__(self, step: int) -> Tensor:
        start = step * self.batch_size
        positions = torch.arange(start, start + self.batch_size)
        epochs = positions // self.size
        return torch.cat(
            [self._epoch(int(e))[positions[epochs == e] % self.size] for e in epochs.unique()]
        )


def majority_baseline(data: TaskData | ImageData) -> float:
    """Test accuracy of always answering the most frequent training label (of a sequence or
    an image task: anything whose ``train`` and ``test`` splits have ``labels``)."""
    majority = int(torch.bincount(data.train.labels).argmax())
    return float((data.test.labels == majority).double().mean())


def make_batch(split: SequenceDataset, index: Tensor, device: torch.device) -> dict[str, Tensor]:
    batch = {
        "tokens": split.tokens[index].long(),
        "lengths": split.lengths[index],
        "labels": split.labels[index],
    }
    if split.tokens2 is not None and split.lengths2 is not None:
        batch["tokens2"], batch["lengths2"] = split.tokens2[index].long(), split.lengths2[index]
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def key_mask(tokens: Tensor, lengths: Tensor, pad_id_mask: bool) -> Tensor | None:
    mask = SequenceDataset.padding_mask(tokens, lengths, pad_id_mask=pad_id_mask)
    return mask if bool(mask.any()) else None
