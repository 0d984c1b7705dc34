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
    same) or from a ``(B or 1, 1 or H, L, L)`` mask whose pattern is exactly that of packed
    documents with no padded key: row ``i`` sees the keys of its document (those ``<= i``
    where ``causal``). A document starts where a query does not see the key just before it.
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
        return cu if cu.numel() > 2 else None
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 4:
        return None
    if tuple(attention_mask.shape[-2:]) != (lq, lk) or attention_mask.shape[0] not in (1, batch):
        return None
    keep = as_keep(attention_mask).expand(batch, -1, -1, -1)
    positions = torch.arange(lq, device=keep.device)
    starts = torch.ones(batch, lq, dtype=torch.bool, device=keep.device)
    starts[:, 1:] = ~keep[:, 0, positions[1:], positions[:-1]]
    if not bool(starts[:, 1:].any()):
        return None
    document = starts.cumsum(dim=1)
    expected = document[:, :, None] == document[:, None, :]
    if causal:
        expected &= torch.ones(lq, lk, dtype=torch.bool, device=keep.device).tril()
    if not torch.equal(keep, expected[:, None].expand_as(keep)):
        return None
    first = starts.flatten().nonzero().flatten().cpu()
    return torch.cat([first, torch.tensor([batch * lq])])
