"""Packed ("varlen") sequences: several documents laid end to end in one row, delimited by
cumulative lengths ``cu_seqlens = [0, L_1, L_1 + L_2, …, T]`` (the layout of FlashAttention's
``*_varlen`` functions and of training with sequence packing), and the padded batch that every
kattn mechanism takes.

* :func:`check_cu_seqlens` — validate cumulative lengths against a total ``T``.
* :func:`pad_packed` — ``(1, H, T, D)`` packed → ``(N, H, L_max, D)`` padded, one document per
  row (several tensors delimited alike with one gather index), with the ``(N, L_max)``
  ``key_padding_mask`` (True marks padding) of that batch. Padded slots hold zeros, so no
  gradient reaches a real token through them.
* :func:`unpad_to_packed` — the inverse for outputs: ``(N, H, L_max, Dv)`` → ``(1, H, T, Dv)``,
  the padded queries' rows dropped.

:meth:`kattn.Attention.forward_packed` runs any mechanism over packed documents with these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["check_cu_seqlens", "pad_packed", "unpad_to_packed"]


def check_cu_seqlens(
    cu_seqlens: Tensor | Sequence[int], total: int, *, name: str = "cu_seqlens"
) -> Tensor:
    """``cu_seqlens`` as a 1-D int64 CPU tensor after checking that it holds at least two
    entries, starts at 0, never decreases and ends at ``total``; ``ValueError`` otherwise.

    Documents of length 0 (repeated entries) are allowed; they hold no token.
    """
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype in (
            torch.bool,
            torch.complex64,
            torch.complex128,
        ):
            raise ValueError(f"{name} must hold integers, got dtype {cu_seqlens.dtype}")
        cu = cu_seqlens.detach().to("cpu", torch.int64)
    else:
        try:
            cu = torch.as_tensor(list(cu_seqlens), dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{name} must be a sequence of ints, got {cu_seqlens!r}") from error
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(
            f"{name} must be 1-D with at least two entries [0, …, T], got shape {tuple(cu.shape)}"
        )
    if int(cu[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(cu[0])}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name} must never decrease, got {cu.tolist()}")
    if int(cu[-1]) != total:
        raise ValueError(f"{name} must end at the packed length T={total}, got {int(cu[-1])}")
    return cu


def pad_packed(
    cu_seqlens: Tensor | Sequence[int], *tensors: Tensor, documents: Tensor | None = None
) -> tuple[tuple[Tensor, ...], Tensor]:
    """Packed ``tensors`` ``(1, H, T, ·)`` (one or more, delimited alike) as padded batches
    ``(N, H, L_max, ·)``, document ``n`` (tokens ``cu_seqlens[n] … cu_seqlens[n+1] − 1``) in row
    ``n`` from position 0, and their ``(N, L_max)`` bool ``key_padding_mask`` (True marks
    padding). ``L_max`` is the longest document (at least 1); padded slots are zeros.

    ``documents``: the indices of the documents to keep (all by default), which then are the
    rows, in that order. The index of the gather is built once for all the tensors.
    """
    if not tensors:
        raise ValueError("pad_packed needs at least one tensor")
    total = tensors[0].shape[2] if tensors[0].dim() == 4 else -1
    for x in tensors:
        if x.dim() != 4 or x.shape[0] != 1 or x.shape[2] != total:
            raise ValueError(
                "packed tensors must be (1, H, T, ·), one row of documents of the same T, got "
                f"shapes {[tuple(t.shape) for t in tensors]}"
            )
    device = tensors[0].device
    cu = check_cu_seqlens(cu_seqlens, total).to(device)
    starts, lengths = cu[:-1], cu.diff()
    if documents is not None:
        starts, lengths = starts[documents], lengths[documents]
    longest = max(int(lengths.max()), 1) if lengths.numel() else 1
    positions = torch.arange(longest, device=device)
    valid = positions[None, :] < lengths[:, None]  # (N, L_max)
    index = (starts[:, None] + positions[None, :]).clamp(max=max(total - 1, 0))
    padded = []
    for x in tensors:
        if total == 0:
            padded.append(x.new_zeros(lengths.numel(), x.shape[1], longest, x.shape[3]))
            continue
        gathered = x[0][:, index].transpose(0, 1)  # (N, H, L_max, ·)
        padded.append(torch.where(valid[:, None, :, None], gathered, gathered.new_zeros(())))
    return tuple(padded), ~valid


def unpad_to_packed(out: Tensor, key_padding_mask: Tensor) -> Tensor:
    """The rows of padded outputs ``out (N, H, L_max, Dv)`` that are not padding
    (``key_padding_mask (N, L_max)``, True marks padding) laid end to end: ``(1, H, T, Dv)``."""
    return out.transpose(0, 1)[:, ~key_padding_mask][None]
