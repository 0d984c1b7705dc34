"""Local (sliding-window) softmax attention, the Local Attention baseline of Long Range Arena."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import int_at_least, positive_float_or_none, positive_int
from ..functional.local import (
    LocalState,
    local_attention,
    local_init_state,
    local_pattern,
    local_prefill,
    local_step,
)
from ..functional.sparse import sparse_attention_reference
from ..registry import register_mechanism
from .base import Attention


class LocalAttention(Attention):
    """Exact softmax over a sliding window of keys: query i reads the keys j with
    ``i − look_backward ≤ j ≤ i + look_forward``, and only ``j ≤ i`` when causal (Tay et al.,
    Long Range Arena, ICLR 2021, its Local Attention baseline; the local pattern of Child et
    al. 2019). Computed on the block-sparse core in O(L·W·D) time and O(L·W) memory.

    This is the exact per-token band; the blocked variant of the LRA code (each query block
    reads whole neighbouring key blocks) is left for a later step.

    ``window`` is the number of keys a query reads away from the sequence edges, including
    itself. With look_backward and look_forward left None they are derived from it:
    bidirectional, ``look_backward = window // 2`` and ``look_forward = window − 1 −
    window // 2`` (window 256: 128 keys back, 127 forward); causal, ``look_backward =
    window − 1`` (and nothing forward). A given look_backward is used in both forms, a given
    look_forward only in the bidirectional one.

    Decoding (always causal) keeps a ring buffer of the last ``look_backward + 1`` keys and
    values (:class:`~kattn.functional.local.LocalState`): O(W·D) memory and time per token.
    Cross-attention (Lq ≠ Lk) is not supported: the window is defined on aligned positions.

    Args:
        window: keys per query (see above), a positive int.
        look_backward: keys before the query, an int >= 0, or None to derive it from window.
        look_forward: keys after the query (bidirectional only), an int >= 0, or None.
        block_size: tokens per block of the block-sparse core (speed only, not the result).
        scale: logit scale, default ``1/√D``.
    """

    is_exact = True
    supports_recurrent = True
    supports_cross = False

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        window: int = 256,
        look_backward: int | None = None,
        look_forward: int | None = None,
        block_size: int = 64,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            window=window,
            look_backward=look_backward,
            look_forward=look_forward,
            block_size=block_size,
            scale=scale,
        )
        self.window = positive_int("window", window)
        if look_backward is not None:
            int_at_least("look_backward", look_backward, 0)
        if look_forward is not None:
            int_at_least("look_forward", look_forward, 0)
        self.look_backward = look_backward
        self.look_forward = look_forward
        self.block_size = positive_int("block_size", block_size)
        self.scale = positive_float_or_none("scale", scale)

    def band(self, causal: bool) -> tuple[int, int]:
        """``(look_backward, look_forward)`` of the band used by the causal or the
        bidirectional form (look_forward is 0 when causal)."""
        if causal:
            back = self.window - 1 if self.look_backward is None else self.look_backward
            return back, 0
        back = self.window // 2 if self.look_backward is None else self.look_backward
        fwd = self.window - 1 - self.window // 2 if self.look_forward is None else self.look_forward
        return back, fwd

    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return ": the sliding window is defined on aligned query and key positions (Lq == Lk)"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        back, fwd = self.band(causal)
        return local_attention(
            q,
            k,
            v,
            look_backward=back,
            look_forward=fwd,
            causal=causal,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
            block_size=self.block_size,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        back, fwd = self.band(causal)
        allowed = local_pattern(q.shape[2], k.shape[2], back, fwd, causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> LocalState:
        back, _ = self.band(True)
        return local_init_state(
            batch_size, self.num_heads, self.head_dim, back, device=device, dtype=dtype
        )

    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: LocalState
    ) -> tuple[Tensor, LocalState]:
        return local_step(q_t, k_t, v_t, state, scale=self.scale)

    def _prefill(
        self, q: Tensor, k: Tensor, v: Tensor, state: LocalState
    ) -> tuple[Tensor, LocalState]:
        return local_prefill(q, k, v, state, scale=self.scale)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, window={self.window}, "
            f"look_backward={self.look_backward}, look_forward={self.look_forward}, "
            f"block_size={self.block_size}, scale={self.scale}"
        )


register_mechanism(
    "local",
    LocalAttention,
    summary="Exact softmax over a sliding window of keys around each query (the LRA Local "
    "Attention baseline), on the block-sparse core; decodes with a ring buffer.",
    reference="Tay et al., Long Range Arena: A Benchmark for Efficient Transformers, ICLR 2021 "
    "(local attention baseline)",
    complexity="O(L·W·D) time, O(L·W) memory (W = window); O(W·D) per decoding step",
    colour="#bcbd22",
    size_option=None,
)
