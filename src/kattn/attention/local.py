"""Local (sliding-window) softmax attention, the Local Attention baseline of Long Range Arena."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import boolean, int_at_least, positive_float_or_none, positive_int
from ..functional.local import (
    LocalState,
    local_attention,
    local_blocked_attention,
    local_blocked_pattern,
    local_init_state,
    local_pattern,
    local_prefill,
    local_step,
)
from ..functional.sparse import sparse_attention_reference
from ..registry import register_mechanism
from .base import Attention

#: the forms of the window: the exact per-token band, or whole blocks of ``window`` tokens.
VARIANTS = ("exact", "blocked")


class LocalAttention(Attention):
    """Exact softmax over a local window of keys around each query (Tay et al., Long Range
    Arena, ICLR 2021, its Local Attention baseline; the local pattern of Child et al. 2019),
    on the block-sparse core in O(L·W·D) time and O(L·W) memory, in one of two variants.

    ``variant="exact"`` (default), the per-token band: query i reads the keys j with
    ``i − look_backward ≤ j ≤ i + look_forward``, and only ``j ≤ i`` when causal. ``window``
    is the number of keys a query reads away from the sequence edges, including itself; with
    look_backward and look_forward left None: bidirectional, ``look_backward = window // 2``
    and ``look_forward = window − 1 − window // 2`` (window 256: 128 back, 127 forward);
    causal, ``look_backward = window − 1``. A given look_backward is used in both forms, a
    given look_forward only in the bidirectional one. This equals lucidrains'
    ``local-attention`` with ``exact_windowsize=True`` when look_backward and look_forward
    here are its ``window_size·look_backward`` and ``window_size·look_forward`` (padding as
    in the blocked case below).

    ``variant="blocked"``: the sequence is cut into blocks of ``window`` tokens (the last one
    partial when window does not divide L); a query in block n reads every key of the blocks
    ``n − look_backward … n + look_forward`` that exist, and when causal the blocks
    ``n − look_backward … n`` with ``j ≤ i`` (its own block up to itself). look_backward and
    look_forward count blocks: None gives 1 back, and 1 forward (0 when causal).

    * lucidrains' ``local_attention.LocalAttention(window_size=window, causal,
      look_backward, look_forward)`` (its defaults: ``exact_windowsize=False``, and no rotary
      embedding without ``dim``) computes the same output. Its ``autopad=True`` pads q, k, v
      with zeros to a whole block: the causal outputs are unchanged, but without a ``mask``
      the zero keys count (logit 0) in the non-causal last blocks; here the missing positions
      of the partial block count nowhere, as in lucidrains given an all-True ``mask``. It also
      fills masked logits with the most negative float, so a query whose blocks hold only
      padding gets a uniform average over them where this gives zeros.
    * The LRA code (``lra_benchmarks/models/local``, ``block_size`` tokens per block) lets each
      block read only itself: ``look_backward = look_forward = 0``, ``window = block_size``.
      It appends ``block_size − L mod block_size`` zero tokens (a whole block when the length
      is a multiple) that its padded mask marks as tokens, so they count in the last block's
      softmax; and its reshape of the length axis to ``(block_size, num_blocks)`` groups the
      positions equal modulo num_blocks rather than contiguous runs. Here blocks are
      contiguous and nothing beyond L counts. (Its causal mask is marked untested there; the
      LRA tasks use the bidirectional encoder.)

    Decoding (always causal) keeps a ring buffer of the last ``(look_backward + 1)·window``
    keys and values (window 1 for the band; :class:`~kattn.functional.local.LocalState`):
    O(W·D) memory and time per token; a prefill reads a prompt in one parallel pass.
    Cross-attention (Lq ≠ Lk) is not supported: the window is defined on aligned positions.

    Args:
        window: keys per query (exact), or tokens per block (blocked), a positive int.
        look_backward: keys (exact) or blocks (blocked) before the query, an int >= 0, or
            None for the defaults above.
        look_forward: keys or blocks after it (bidirectional only), an int >= 0, or None.
        block_size: tokens per block of the block-sparse core (speed only, not the result);
            None: 64 for the band, ``window`` for the blocked form.
        scale: logit scale, default ``1/√D``.
        variant: ``"exact"`` or ``"blocked"``.
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
        block_size: int | None = None,
        scale: float | None = None,
        variant: str = "exact",
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            window=window,
            look_backward=look_backward,
            look_forward=look_forward,
            block_size=block_size,
            scale=scale,
            variant=variant,
        )
        self.window = positive_int("window", window)
        if look_backward is not None:
            int_at_least("look_backward", look_backward, 0)
        if look_forward is not None:
            int_at_least("look_forward", look_forward, 0)
        self.look_backward = look_backward
        self.look_forward = look_forward
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.variant = variant
        if block_size is None:  # the blocked form's blocks are then the core's
            block_size = self.window if variant == "blocked" else 64
        self.block_size = positive_int("block_size", block_size)
        self.scale = positive_float_or_none("scale", scale)

    def band(self, causal: bool) -> tuple[int, int]:
        """``(look_backward, look_forward)`` used by the causal or the bidirectional form, in
        keys (exact) or blocks (blocked); look_forward is 0 when causal."""
        if self.variant == "blocked":
            back = 1 if self.look_backward is None else self.look_backward
            return back, 0 if causal else (1 if self.look_forward is None else self.look_forward)
        if causal:
            back = self.window - 1 if self.look_backward is None else self.look_backward
            return back, 0
        back = self.window // 2 if self.look_backward is None else self.look_backward
        fwd = self.window - 1 - self.window // 2 if self.look_forward is None else self.look_forward
        return back, fwd

    def pattern(
        self, length: int, *, causal: bool = False, device: torch.device | str | None = None
    ) -> Tensor:
        """The bool ``(1, L, L)`` pattern of a self-attention of length L with the current
        options and variant: ``[0, i, j]`` is True iff query i reads key j (key padding
        aside); the leading dim is 1, as every head reads the same keys."""
        back, fwd = self.band(boolean("causal", causal))
        if self.variant == "blocked":
            allowed = local_blocked_pattern(
                length, length, self.window, back, fwd, causal, device=device
            )
        else:
            allowed = local_pattern(length, length, back, fwd, causal, device=device)
        return allowed[None]

    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return ": the sliding window is defined on aligned query and key positions (Lq == Lk)"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        back, fwd = self.band(causal)
        kind = {"look_backward": back, "look_forward": fwd, "block_size": self.block_size}
        if self.variant == "blocked":
            return local_blocked_attention(
                q,
                k,
                v,
                window=self.window,
                causal=causal,
                key_padding_mask=key_padding_mask,
                scale=self.scale,
                **kind,
            )
        return local_attention(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=self.scale, **kind
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        allowed = self.pattern(q.shape[2], causal=causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> LocalState:
        back, _ = self.band(True)
        block = self.window if self.variant == "blocked" else 1
        return local_init_state(
            batch_size,
            self.num_heads,
            self.head_dim,
            back,
            window=block,
            device=device,
            dtype=dtype,
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
            f"block_size={self.block_size}, scale={self.scale}, variant={self.variant!r}"
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
    approximates="softmax",
    size_option=None,
)
