"""Masks between transformers and kattn: what the ``kattn:<name>`` mask function makes, and
how a mask of transformers becomes kattn's ``key_padding_mask`` (True marks padding).

kattn mechanisms take causality as a flag and padding as a ``(B, Lk)`` mask; they cannot
apply an arbitrary ``(Lq, Lk)`` pattern (a kernelized sum has no attention matrix to mask).
For the plain causal and bidirectional patterns (and a sliding window as wide as every
position of the call, such as Mistral's default 4096, or attention chunks that hold every
position) the mask function therefore returns only the padding, as a ``(B, 1, 1, Lk)`` bool
"attend" mask (None without padding), so a forward never builds an ``Lq × Lk`` tensor; any
other pattern (shorter sliding windows or chunks, packed sequences, extra mask functions) is
materialised as transformers' bool mask and :func:`key_padding_mask` accepts it only where
it is causal (or full) attention with padded keys, raising otherwise (packed documents are
recognised before, by :mod:`kattn.hf.packing`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers.masking_utils import (
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)


def kattn_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] = causal_mask_function,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """The mask transformers hands to the ``kattn:<name>`` attention functions.

    Args (as transformers' ``sdpa_mask``): the batch size, the query and key lengths and
    offsets, the pattern ``mask_function`` and the 2-D ``attention_mask`` (True or 1 = a real
    token) over the ``kv_offset + kv_length`` positions.

    Returns:
        None when no key is padded; ``(B, 1, 1, kv_length)`` bool (True = attend) for the
        causal and bidirectional patterns and a plain sliding window or chunk that covers every
        position; the full ``(B, 1, q_length, kv_length)`` bool mask of any other pattern.
    """
    plain = mask_function is causal_mask_function or mask_function is bidirectional_mask_function
    if plain or _window_covers(q_length, kv_length, q_offset, kv_offset, kwargs):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            return None
        keep = padding[:, kv_offset : kv_offset + kv_length].to(torch.bool)
        if bool(keep.all()):
            return None
        return keep[:, None, None, :]
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        use_vmap=kwargs.get("use_vmap", False),
        device=kwargs.get("device", "cpu"),
    )


def _window_covers(
    q_length: int, kv_length: int, q_offset: int, kv_offset: int, kwargs: dict[str, Any]
) -> bool:
    """Whether the pattern is a local one (``local_size``: a sliding window, or the chunks of
    chunked attention) with nothing laid over it (transformers then allows the causal or
    bidirectional skip) that covers every query and key position of the call, so that it is
    the plain causal or bidirectional pattern (:func:`local_pattern_covers`)."""
    size = kwargs.get("local_size")
    plain = kwargs.get("allow_is_causal_skip") or kwargs.get("allow_is_bidirectional_skip")
    if size is None or not plain:
        return False
    first = min(q_offset, kv_offset)
    end = max(q_offset + q_length, kv_offset + kv_length)
    chunks = not _is_sliding_window(int(size), kwargs.get("config"))
    return local_pattern_covers(int(size), first, end, chunks=chunks)


def local_pattern_covers(size: int, first: int, end: int, *, chunks: bool) -> bool:
    """Whether a local pattern of ``size`` positions lets each query among the positions
    ``[first, end)`` see every key there that causality (if any) allows.

    A sliding window does when the positions span at most ``size``. Chunks of ``size``
    (chunked attention, as in Llama 4) start at each sequence's first real token, which the
    call does not tell, so they do only when the positions start at 0 and end within the
    first chunk: a span of ``size`` further on may cross a chunk boundary.
    """
    if chunks and first > 0:
        return False
    return end - first <= size


def _is_sliding_window(size: int, config: Any) -> bool:
    """Whether a ``local_size`` of ``size`` is ``config``'s sliding window rather than its
    attention chunks (both reach the mask function as ``local_size``; a chunked-attention
    layer's cache is a sliding-window layer too). Unknown (no config, or both of that size)
    counts as chunks, whose rule is the stricter."""
    chunk = getattr(config, "attention_chunk_size", None)
    window = getattr(config, "sliding_window", None)
    return window is not None and int(window) == size and (chunk is None or int(chunk) != size)


def key_padding_mask(
    attention_mask: Tensor | None, *, batch: int, lq: int, lk: int, causal: bool
) -> Tensor | None:
    """kattn's ``(B, Lk)`` padding mask (True = padded key) for the last ``lk`` keys of a mask
    of transformers, or None if no key is padded.

    ``attention_mask`` is None, a bool mask (True = attend) or an additive float mask (0 or
    very negative), of shape ``(B or 1, 1 or H, 1 or Lq', Lk')`` with ``Lk' >= lk`` (the keys
    before the last ``lk`` are those a recurrent state holds already). A mask with one row per
    query must be the ``causal`` (queries aligned with the last keys) or full pattern with
    padded keys; anything else raises ``NotImplementedError``.
    """
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 4:
        raise NotImplementedError(
            "attention_mask: kattn mechanisms take a 2-D padding mask or the 4-D masks "
            f"transformers builds from one, got {type(attention_mask).__name__} of shape "
            f"{tuple(getattr(attention_mask, 'shape', ()))}"
        )
    keep = as_keep(attention_mask)[..., -lk:] if attention_mask.shape[-1] >= lk else None
    if keep is None or keep.shape[0] not in (1, batch) or keep.shape[2] not in (1, lq):
        raise ValueError(
            f"attention_mask of shape {tuple(attention_mask.shape)} does not fit a batch of "
            f"{batch} with {lq} queries and {lk} keys"
        )
    keep = keep.expand(batch, -1, -1, -1)
    keys = keep.any(dim=2).all(dim=1) if keep.shape[2] > 1 else keep[:, :, 0].all(dim=1)
    if keep.shape[2] > 1 or keep.shape[1] > 1:
        _check_pattern(keep, keys, causal=causal)
    return None if bool(keys.all()) else ~keys


def as_keep(mask: Tensor) -> Tensor:
    """A bool "attend" version of a bool or additive float mask (0 = attend)."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"attention_mask must be bool or floating, got {mask.dtype}")
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    if not bool(torch.all(blocked | (mask == 0))):
        raise NotImplementedError(
            "attention_mask holds additive biases other than 0 and -inf: kattn mechanisms "
            "cannot add a bias to attention logits they never form"
        )
    return ~blocked


def _check_pattern(keep: Tensor, keys: Tensor, *, causal: bool) -> None:
    """``NotImplementedError`` unless ``keep (B, H', Lq, Lk)`` is the causal (or full)
    pattern with the padded keys of ``keys (B, Lk)`` taken out."""
    lq, lk = keep.shape[-2:]
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=keep.device)
    if causal:
        allowed = allowed.tril(lk - lq)
    expected = allowed[None, None] & keys[:, None, None, :]
    if not torch.equal(keep, expected.expand_as(keep)):
        kind = "causal" if causal else "full (bidirectional)"
        raise NotImplementedError(
            f"attention_mask is not {kind} attention with padded keys (e.g. a sliding window "
            "or attention chunks shorter than the sequence, packed sequences or a custom 4-D "
            "mask): kattn mechanisms take only causality and key padding, not an arbitrary "
            "(Lq, Lk) mask"
        )
