"""The Sparse Transformer's factorised attention (Child et al. 2019), strided and fixed."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import boolean, positive_float_or_none, positive_int
from ..functional.sparse import sparse_attention_reference
from ..functional.sparse_transformer import (
    HEADS,
    PATTERNS,
    sparse_transformer_attention,
    sparse_transformer_pattern,
)
from ..registry import register_mechanism
from .base import Attention


class SparseTransformerAttention(Attention):
    """Exact softmax over the factorised patterns of the Sparse Transformer (Child et al. 2019,
    "Generating Long Sequences with Sparse Transformers", §4.2–4.3), on the block-sparse core:
    O(L·(l + L/l)·D) time for the strided pattern, O(L·(l + c·L/l)·D) for the fixed one.

    With l = ``stride`` and c = ``c``, the causal factors (§4.2) are, for query i,

    * ``pattern="strided"``: A(1) = the previous l positions ``i − l < j ≤ i``, A(2) = every
      l-th position back, ``j ≤ i`` with ``(i − j) mod l = 0``;
    * ``pattern="fixed"``: A(1) = its own block, ``j ≤ i`` with ``⌊j/l⌋ = ⌊i/l⌋``, A(2) = the
      last c positions of every block, ``j ≤ i`` with ``j mod l ≥ l − c``.

    Without ``causal``, ``j ≤ i`` is dropped: the strided band becomes ``|i − j| < l`` and A(2)
    every position of i's residue class (both symmetric in i and j); the fixed A(1) is i's
    whole block and A(2) every summary position. Each non-causal form still connects every
    query to every key in two steps, the property §4.2 asks of a factorisation.
    ``heads="union"`` is the paper's merged head (§4.3): every head reads A(1) ∪ A(2).
    ``heads="split"`` gives each factor its own heads, concatenated as in multi-head
    attention: heads ``0 … ⌈H/2⌉ − 1`` read A(1) and the rest A(2) (with H odd, the local
    factor gets the extra head; H = 1 is refused).

    Defaults: ``pattern="strided"`` (the pattern of §4.2 for data with a periodic structure,
    the cheaper one at long lengths); ``stride=128``, about √L at L = 16K (§4.2 takes l ≈ √n)
    and the value of the paper's Enwik8 model; ``c=8``, the smallest of the c ∈ {8, 16, 32} that
    §4.2 reports working for l ∈ {128, 256} (its Enwik8 model used the fixed pattern with
    l = 128, c = 32 and merged heads: ``pattern="fixed", c=32``). Long Range Arena runs the
    fixed, merged, always causal pattern with block 50 and c = 10 (``pattern="fixed",
    stride=50, c=10``, with its extra summary at ``j mod l = 0``; see
    :mod:`kattn.functional.sparse_transformer` for the differences from the released code).

    Cross-attention (Lq ≠ Lk) is not supported: the pattern is defined on aligned positions.

    Args:
        pattern: ``"strided"`` or ``"fixed"``.
        stride: l, the stride of the strided pattern and the block length of the fixed one.
        c: summary positions at the end of each block (fixed pattern), an int in [1, stride].
        heads: ``"union"`` or ``"split"``.
        block_size: at most this many tokens per block of the block-sparse core (speed only).
        scale: logit scale, default ``1/√D``.
    """

    is_exact = True
    supports_cross = False

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        pattern: str = "strided",
        stride: int = 128,
        c: int = 8,
        heads: str = "union",
        block_size: int = 64,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            pattern=pattern, stride=stride, c=c, heads=heads, block_size=block_size, scale=scale
        )
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
        if heads not in HEADS:
            raise ValueError(f"heads must be one of {HEADS}, got {heads!r}")
        self.pattern_name = pattern
        self.stride = positive_int("stride", stride)
        self.c = positive_int("c", c)
        self.heads = heads
        self.block_size = positive_int("block_size", block_size)
        self.scale = positive_float_or_none("scale", scale)
        self.pattern(1)  # the checks that join options: c <= stride, split needs H >= 2

    def pattern(
        self, length: int, *, causal: bool = False, device: torch.device | str | None = None
    ) -> Tensor:
        """The bool pattern of a self-attention of length L with the current options:
        ``[h, i, j]`` is True iff query i of head h reads key j (key padding aside). Shape
        ``(1, L, L)`` for ``heads="union"`` (every head alike), ``(H, L, L)`` for ``"split"``."""
        return sparse_transformer_pattern(
            length, pattern=self.pattern_name, stride=self.stride, c=self.c, heads=self.heads,
            num_heads=self.num_heads, causal=boolean("causal", causal), device=device,
        )  # fmt: skip

    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return ": the factorised pattern is defined on aligned query and key positions"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        return sparse_transformer_attention(
            q, k, v, pattern=self.pattern_name, stride=self.stride, c=self.c, heads=self.heads,
            causal=causal, key_padding_mask=key_padding_mask, scale=self.scale,
            block_size=self.block_size,
        )  # fmt: skip

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        allowed = self.pattern(q.shape[2], causal=causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"pattern={self.pattern_name!r}, stride={self.stride}, c={self.c}, "
            f"heads={self.heads!r}, block_size={self.block_size}, scale={self.scale}"
        )


register_mechanism(
    "sparse_transformer",
    SparseTransformerAttention,
    summary="Exact softmax over the Sparse Transformer's factorised patterns (strided: a band "
    "and every stride-th key; fixed: the block and its summary positions), merged or split "
    "across heads, on the block-sparse core.",
    reference="Child, Gray, Radford and Sutskever, Generating Long Sequences with Sparse "
    "Transformers, arXiv 2019",
    complexity="O(L·(l + L/l)·D) time, O(L·(l + L/l)) memory (strided, l = stride); "
    "O(L·(l + c·L/l)·D) and O(L·(l + c·L/l)) for fixed",
    colour="#6b6ecf",
    approximates="softmax",
    size_option=None,
)
