"""Attention over packed documents (:meth:`kattn.Attention.forward_packed`): each document
attends to itself alone, through one forward call of the mechanism on the padded batch of the
documents (:mod:`kattn.functional.varlen`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..functional.varlen import check_cu_seqlens, pad_packed, unpad_to_packed

if TYPE_CHECKING:
    from .base import Attention

__all__ = ["packed_forward"]


def packed_forward(
    attn: Attention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor | Sequence[int],
    *,
    cu_seqlens_k: Tensor | Sequence[int] | None = None,
    causal: bool = False,
) -> Tensor:
    """Attend over packed documents (the method ``attn.forward_packed``): q ``(1, H, T, D)``,
    k ``(1, H, Tk, D)`` and v ``(1, H, Tk, Dv)`` hold documents laid end to end, delimited by
    the cumulative lengths ``cu_seqlens = [0, L_1, L_1 + L_2, …, T]`` (``cu_seqlens_k`` for
    the keys' documents when they differ, as in cross-attention); each document attends to
    its own keys alone. Returns ``(1, H, T, Dv)``.

    ``attn`` runs one forward call on the documents as a padded batch ``(N, H, L_max, ·)``
    with their ``key_padding_mask``, so it works for every mechanism that takes padding (and
    for any mechanism when the documents have equal lengths); it costs what that batch costs,
    ``N · L_max`` positions. In training, every document sees the same random features of
    that call. Mechanisms whose rows depend on other queries
    (``capabilities()["rows_depend_on_other_queries"]``) see a document's padded query
    positions as they see padding in any batch. Empty documents are allowed; ``causal``
    needs each document's query and key lengths equal.
    """
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[0] != 1:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(
                f"{arg} must be packed as (1, H, T, D): one row of documents laid end to end, "
                f"got {shape}"
            )
    cu_q = check_cu_seqlens(cu_seqlens, q.shape[2])
    if cu_seqlens_k is None:
        if k.shape[2] != q.shape[2]:
            raise ValueError(
                f"k has {k.shape[2]} packed positions and q {q.shape[2]}: pass cu_seqlens_k "
                "for the keys' documents"
            )
        cu_k = cu_q
    else:
        cu_k = check_cu_seqlens(cu_seqlens_k, k.shape[2], name="cu_seqlens_k")
        if cu_k.numel() != cu_q.numel():
            raise ValueError(
                f"cu_seqlens delimits {cu_q.numel() - 1} documents and cu_seqlens_k "
                f"{cu_k.numel() - 1}: each query document needs its key document"
            )
    len_q, len_k = cu_q.diff(), cu_k.diff()
    if causal and not torch.equal(len_q, len_k):
        raise ValueError(
            "causal attention needs every document's query and key lengths equal, got "
            f"{len_q.tolist()} and {len_k.tolist()}"
        )
    if not attn.supports_cross and not torch.equal(len_q, len_k):
        raise NotImplementedError(
            f"{type(attn).__name__} does not support cross-attention, and documents' query and "
            f"key lengths differ ({len_q.tolist()} and {len_k.tolist()}){attn._why_not('cross')}"
        )
    keyless = ((len_q > 0) & (len_k == 0)).nonzero().flatten().tolist()
    if keyless:
        raise ValueError(f"documents {keyless} have queries but no keys")
    # documents without queries are dropped: an all-padding row would only cost time
    kept = None if bool((len_q > 0).all()) else (len_q > 0).nonzero().flatten().to(q.device)
    if kept is not None and kept.numel() == 0:  # no query at all
        return v.new_zeros(1, v.shape[1], 0, v.shape[3])
    (q_rows,), query_padding = pad_packed(cu_q, q, documents=kept)
    (k_rows, v_rows), key_padding = pad_packed(cu_k, k, v, documents=kept)
    mask = key_padding if bool(key_padding.any()) else None
    out = attn(q_rows, k_rows, v_rows, causal=causal, key_padding_mask=mask)
    return unpad_to_packed(out, query_padding)
