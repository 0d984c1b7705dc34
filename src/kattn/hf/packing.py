"""Packed sequences in transformers models: several documents laid end to end in a row, as
``DataCollatorWithFlattening`` makes them (position ids that restart at 0 at each document).

transformers then hands the attention function either the documents' cumulative lengths
(``cu_seq_lens_q``/``cu_seq_lens_k``, with ``return_flash_attn_kwargs=True``) or a 4-D mask
whose pattern is block diagonal: a query sees the keys of its own document (the earlier ones
only, in a causal model). :func:`packed_documents` recognises either and gives the documents'
``cu_seqlens`` over the batch's rows laid end to end, which
:meth:`kattn.Attention.forward_packed` takes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .masks import as_keep

__all__ = ["packed_documents"]


def packed_documents(
    attention_mask: Tensor | None,
    kwargs: dict[str, Any],
    *,
    batch: int,
    lq: int,
    lk: int,
    causal: bool,
) -> Tensor | None:
    """The cumulative document lengths ``[0, …, B·L]`` of the call's rows laid end to end,
    where the call packs several documents into a row; None otherwise (one document per row,
    padding included, is the plain pattern :func:`~kattn.hf.masks.key_padding_mask` takes).

    Taken from ``kwargs["cu_seq_lens_q"]`` (a batch of one; ``cu_seq_lens_k`` must be the
    same, and a mask passed with them must agree: ``NotImplementedError`` otherwise, padding
    included) or from a ``(B or 1, 1 or H, L, L)`` mask whose pattern is exactly that of
    packed documents with no padded key: row ``i`` sees the keys of its document (those
    ``<= i`` where ``causal``). A document starts where a query does not see the key just
    before it.
    """
    if lq != lk:
        return None
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and batch == 1:
        cu = torch.as_tensor(cu).to("cpu", torch.int64)
        cu_k = kwargs.get("cu_seq_lens_k")
        if cu_k is not None and not torch.equal(torch.as_tensor(cu_k).to("cpu", torch.int64), cu):
            raise NotImplementedError(
                "cu_seq_lens_k differs from cu_seq_lens_q in self-attention: kattn takes "
                "packed documents whose queries and keys are the same tokens"
            )
        if cu.numel() <= 2:
            return None
        starts = torch.zeros(1, lq, dtype=torch.bool)
        starts[0, cu[:-1].clamp(max=lq - 1)] = True
        if attention_mask is not None and not _is_pattern(attention_mask, starts, causal):
            raise NotImplementedError(
                "attention_mask does not agree with the packed documents of cu_seq_lens_q "
                "(padded keys, say): kattn takes packed documents without padding"
            )
        return cu
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 4:
        return None
    if tuple(attention_mask.shape[-2:]) != (lq, lk) or attention_mask.shape[0] not in (1, batch):
        return None
    keep = as_keep(attention_mask)
    positions = torch.arange(lq, device=keep.device)
    starts = torch.ones(batch, lq, dtype=torch.bool, device=keep.device)
    starts[:, 1:] = ~keep.expand(batch, -1, -1, -1)[:, 0, positions[1:], positions[:-1]]
    if not bool(starts[:, 1:].any()) or not _is_pattern(keep, starts, causal):
        return None
    first = starts.flatten().nonzero().flatten().cpu()
    return torch.cat([first, torch.tensor([batch * lq])])


def _is_pattern(mask: Tensor, starts: Tensor, causal: bool) -> bool:
    """Whether a 4-D mask of transformers is the pattern of the documents that begin where
    ``starts (B, L)`` is True (a compact ``(·, ·, 1, L)`` key mask: whether it pads nothing)."""
    keep = as_keep(mask)
    if keep.dim() != 4 or keep.shape[-1] != starts.shape[1]:
        return False
    if keep.shape[-2] == 1:
        return bool(keep.all())
    document = starts.to(keep.device).cumsum(dim=1)
    expected = document[:, :, None] == document[:, None, :]
    if causal:
        expected &= torch.ones_like(expected[0]).tril()
    try:
        return torch.equal(*torch.broadcast_tensors(keep, expected[:, None]))
    except RuntimeError:  # shapes that do not broadcast
        return False
