"""Longformer attention (Beltagy et al. 2020): a sliding window, optionally dilated, plus global
tokens, exact softmax over that pattern on the block-sparse core.

How it differs from the released code:

* Long Range Arena's baseline (Tay et al., ICLR 2021; ``lra_benchmarks/models/longformer``)
  builds dense ``(L, L)`` masks, so its memory is quadratic; here no ``(L, L)`` tensor is
  formed. Its window of ``w`` keys reads ``w − w//2`` keys back (the query included) and
  ``w//2`` forward; here ``window//2`` back and ``window − 1 − window//2`` forward (the
  convention of ``local``), the same count. It has no dilation; its global tokens come from a
  per-example ``global_mask`` that the LRA tasks leave unset (no global token at all), with
  separate query/key/value projections for the global attention (Beltagy et al. 2020, §3.1).
* The Hugging Face and allenai implementations read ``attention_window/2`` keys on each side
  (``attention_window + 1`` in all), take the global tokens per example from
  ``global_attention_mask`` and also use separate global projections; only allenai's custom
  kernel has dilation (per head) and the autoregressive form.
* Here the mechanism receives projected q, k, v (the kattn contract), so the window and the
  global attention share one set of projections; the global positions are options of the
  module, the same for every example; the dilation is one int for all heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..checks import int_at_least, positive_float_or_none, positive_int
from ..functional.longformer import longformer_attention, longformer_pattern
from ..functional.sparse import sparse_attention_reference
from ..registry import register_mechanism
from .base import Attention


class LongformerAttention(Attention):
    """Exact softmax over Longformer's pattern (Beltagy et al., Longformer: The Long-Document
    Transformer, 2020, §3.1): query i reads the keys ``i + dilation·m`` of its sliding window
    and every global token; a global token reads every key. Computed on the block-sparse core
    in O(L·(W + G)·D) time and O(L·(W + G)) memory (W = window, G global tokens).

    ``window`` is the number of window keys per query, itself included, as in ``local``:
    bidirectional, ``m`` runs over ``−(window // 2) … window − 1 − window // 2``; causal, over
    ``−(window − 1) … 0``. With ``dilation`` d the window keys are d positions apart (a
    receptive field of ``d·(window − 1) + 1`` positions, Beltagy et al. §3.1).

    Global tokens are global keys (every query reads them) and global queries (they read every
    key). Causal: a global key g is read only by queries ``i ≥ g``, and a global query g reads
    only the keys ``j ≤ g``. A padded position counts nowhere, global or not.

    Defaults: ``window=512`` is the ``sliding_window_size`` of the Long Range Arena Longformer
    baseline (Tay et al., ICLR 2021, ``lra_benchmarks/models/longformer``; the task configs
    keep it). ``num_global=1``: the first token is global, Longformer's classification setting
    (global attention on the [CLS] token, Beltagy et al. §3.1 and §6); the LRA code itself
    passes no global mask (``num_global=0`` reproduces that), and the Skyformer paper's LRA
    comparison (Chen et al., NeurIPS 2021) has no Longformer run. ``dilation=1``: the paper's
    classification models and the LRA baseline use no dilation (§3.1 dilates some heads of
    the autoregressive language model only).

    Cross-attention (Lq ≠ Lk) is not supported: the window is defined on aligned positions.

    Args:
        window: window keys per query (see above), a positive int.
        dilation: the gap between window keys, a positive int (1: a contiguous window).
        num_global: the first ``num_global`` positions are global tokens, an int >= 0 (all
            positions when the sequence is shorter).
        global_positions: explicit global positions instead (overrides num_global): a list of
            ints >= 0, or a comma-separated string of them (``"0,5,9"``, as a command-line
            option); each must be below the sequence length; empty: no global token.
        block_size: tokens per block of the block-sparse core (speed only, not the result).
        scale: logit scale, default ``1/√D``.
    """

    is_exact = True
    supports_cross = False
    supports_recurrent = False

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        window: int = 512,
        dilation: int = 1,
        num_global: int = 1,
        global_positions: Sequence[int] | str | None = None,
        block_size: int = 64,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            window=window,
            dilation=dilation,
            num_global=num_global,
            global_positions=global_positions,
            block_size=block_size,
            scale=scale,
        )
        self.window = positive_int("window", window)
        self.dilation = positive_int("dilation", dilation)
        self.num_global = int_at_least("num_global", num_global, 0)
        self.global_positions = _positions(global_positions)
        self.block_size = positive_int("block_size", block_size)
        self.scale = positive_float_or_none("scale", scale)

    def band(self, causal: bool) -> tuple[int, int]:
        """``(look_backward, look_forward)``: the window steps before and after the query
        (look_forward is 0 when causal)."""
        if causal:
            return self.window - 1, 0
        return self.window // 2, self.window - 1 - self.window // 2

    def global_tokens(self, length: int) -> tuple[int, ...]:
        """The global positions for a sequence of ``length`` positions (ValueError for an
        explicit position beyond it)."""
        if self.global_positions is None:
            return tuple(range(min(self.num_global, length)))
        if self.global_positions and self.global_positions[-1] >= length:
            raise ValueError(
                f"global_positions must lie below the sequence length {length}, got "
                f"{list(self.global_positions)}"
            )
        return self.global_positions

    def pattern(
        self, length: int, *, causal: bool = False, device: torch.device | str | None = None
    ) -> Tensor:
        """The bool ``(1, L, L)`` pattern of a self-attention of ``length`` positions with the
        current options: True where query i reads key j (the same for every head)."""
        back, fwd = self.band(causal)
        allowed = longformer_pattern(
            length, back, fwd, self.dilation, self.global_tokens(length), causal, device=device
        )
        return allowed[None]

    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return ": the sliding window is defined on aligned query and key positions (Lq == Lk)"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        back, fwd = self.band(causal)
        return longformer_attention(
            q,
            k,
            v,
            look_backward=back,
            look_forward=fwd,
            dilation=self.dilation,
            global_tokens=self.global_tokens(k.shape[2]),
            causal=causal,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
            block_size=self.block_size,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        allowed = self.pattern(k.shape[2], causal=causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed[None], key_padding_mask=key_padding_mask, scale=self.scale
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, window={self.window}, "
            f"dilation={self.dilation}, num_global={self.num_global}, "
            f"global_positions={self.global_positions}, block_size={self.block_size}, "
            f"scale={self.scale}"
        )


def _positions(value: object) -> tuple[int, ...] | None:
    """``global_positions`` as sorted unique ints >= 0 (None stays None), or ValueError."""
    if value is None:
        return None
    expected = "a list of ints >= 0 or a comma-separated string of them"
    items: object = value
    if isinstance(value, str):
        try:
            items = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"global_positions must be {expected}, got {value!r}") from None
    if isinstance(items, Tensor) or not isinstance(items, Sequence):
        raise ValueError(f"global_positions must be {expected}, got {value!r}")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in items):
        raise ValueError(f"global_positions must be {expected}, got {value!r}")
    return tuple(sorted(set(items)))


register_mechanism(
    "longformer",
    LongformerAttention,
    summary="Exact softmax over a sliding window (optionally dilated) plus global tokens that "
    "attend to all and are attended by all (Longformer), on the block-sparse core.",
    reference="Beltagy, Peters and Cohan, Longformer: The Long-Document Transformer, arXiv 2020",
    complexity="O(L·(W + G)·D) time, O(L·(W + G)) memory (W = window, G = global tokens)",
    colour="#5254a3",
    approximates="softmax",
    size_option=None,
)
