"""BigBird (Zaheer et al., Big Bird: Transformers for Longer Sequences, NeurIPS 2020, §2 and
App. D): exact softmax over window, random and global blocks, the BigBird-ITC pattern.

How it differs from the released implementations (read, not copied):

- google-research/bigbird (``bigbird/core/attention.py``) seeds numpy once per layer (the
  layer index) and keeps that pattern for training and inference; it needs L to be a multiple
  of the block size and at least (5 + 2r) blocks, special-cases the second and second-last
  query blocks, and at L = 1024, 3072 or 4096 draws random blocks only among the first 1024
  tokens (other lengths follow a "plan" that splits the random blocks between segments).
  Here every eligible block is equally likely at every length, any L works (the last block
  may be partial), and the pattern is the same rule for every query block.
- HuggingFace ``BigBirdModel`` (``models/big_bird``) redraws the random blocks from numpy's
  global RNG in each training forward and, in eval, sets every random slot to block 0 (a
  global block), so inference reads no random block; it uses full attention up to
  (5 + 2r)·b tokens. Here eval reads a fixed draw of r random blocks, and the fallback to full
  attention happens only when the pattern would read every block anyway.
- Long Range Arena (``lra_benchmarks/models/bigbird``) fixes one draw per layer (seeded from
  the module's path), draws random blocks among the first 1024 tokens only, and runs full
  causal attention when causal. Here the causal form is sparse (see below).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import int_at_least, positive_float_or_none, positive_int
from ..functional.bigbird import (
    BigBirdLayout,
    bigbird_attention,
    bigbird_layout,
    bigbird_pattern,
    window_half_width,
)
from ..functional.sparse import sparse_attention_reference
from ..registry import register_mechanism
from .base import Attention
from .seeded import SeededDraws


class BigBirdAttention(SeededDraws, Attention):
    """Exact softmax over the BigBird-ITC pattern (Zaheer et al. 2020, §2, App. D): with
    blocks of ``block_size`` tokens, query block n reads its ``num_window_blocks = 2w + 1``
    neighbouring blocks ``n − w … n + w``, ``num_random_blocks`` random blocks (per head and
    query block, drawn without replacement among the blocks it does not already read) and
    the ``num_global`` global tokens, which read every key and are read by every query
    (:mod:`kattn.functional.bigbird`: a block table and global tokens on the block-sparse
    core). O(L·(W + R)·b·D + G·L·D) time, O(L·(W + R + G/b)·b)
    memory; short sequences, where the pattern would cover every block, get full attention.

    Defaults, from the paper's runs (App. E.1, Table 8, BigBird-ITC: block 64, global tokens
    2·b, window 3·b, random 3·b) and the LRA configuration (block_size 64, num_rand_blocks 3):
    ``block_size=64``, ``num_window_blocks=3``, ``num_random_blocks=3`` and ``num_global =
    2·block_size``: the first and the last block are global, as in the released code's ITC
    layout (in general the first ⌈G/2⌉ and the last ⌊G/2⌋ tokens).

    Randomness: the random blocks follow the seeded contract of
    :mod:`kattn.attention.seeded` (a generator owned by the module, fixed in ``eval()``,
    redrawn per training forward, reused under checkpointing, seed and draws in
    ``state_dict()``); the eval draw is fixed per length and causal flag (:meth:`pattern`
    shows it). Layers built with one seed share their eval pattern; pass ``seed=layer index``
    for distinct ones, as the released code does.

    Causal form (kattn's own; the paper's BigBird is an encoder pattern): window blocks
    ``n − w … n`` with ``j ≤ i`` inside block n, random blocks drawn among the blocks before
    the window, a global key g read by the queries ``i ≥ g`` and a global query g reading the
    keys ``j ≤ g``. Cross-attention is not defined (the blocks pair aligned positions), and
    there is no recurrent form (the draw depends on the whole length).

    Args:
        block_size: b, tokens per block, a positive int.
        num_window_blocks: 2w + 1, an odd positive int.
        num_random_blocks: r, an int >= 0.
        num_global: G, global tokens, an int >= 0; None: ``2·block_size``.
        seed: the seed of the random blocks, an int >= 0.
        scale: logit scale, default ``1/√D``.
    """

    is_exact = True
    supports_cross = False
    supports_recurrent = False
    draw_stream = "bigbird"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        block_size: int = 64,
        num_window_blocks: int = 3,
        num_random_blocks: int = 3,
        num_global: int | None = None,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            block_size=block_size,
            num_window_blocks=num_window_blocks,
            num_random_blocks=num_random_blocks,
            num_global=num_global,
            seed=seed,
            scale=scale,
        )
        self.block_size = positive_int("block_size", block_size)
        window_half_width(num_window_blocks)
        self.num_window_blocks = num_window_blocks
        self.num_random_blocks = int_at_least("num_random_blocks", num_random_blocks, 0)
        if num_global is not None:
            int_at_least("num_global", num_global, 0)
        self.num_global = 2 * block_size if num_global is None else num_global
        self.scale = positive_float_or_none("scale", scale)
        self._init_seeded(seed)

    # ------------------------------------------------------------------------------ pattern
    def layout(
        self, length: int, *, causal: bool = False, device: torch.device | str | None = None
    ) -> BigBirdLayout:
        """The evaluation-mode draw for a self-attention of ``length`` tokens (cached)."""
        return self._layout(length, causal, 0, device)

    def pattern(
        self, length: int, *, causal: bool = False, device: torch.device | str | None = None
    ) -> Tensor:
        """The bool ``(num_heads, L, L)`` pattern of a self-attention of ``length`` tokens in
        eval mode: True where query i reads key j. O(H·L²) memory: for references and plots."""
        allowed = bigbird_pattern(self.layout(length, causal=causal, device=device))
        return allowed.expand(self.num_heads, length, length)

    def _layout(self, length: int, causal: bool, draw: int, device: Any) -> BigBirdLayout:
        """Draw ``draw`` (0 for eval, 1, 2, … in training) for this length and causal flag."""
        return self._drawn(
            (length, int(causal)),
            draw,
            device,
            lambda generator: bigbird_layout(
                length,
                block_size=self.block_size,
                num_window_blocks=self.num_window_blocks,
                num_random_blocks=self.num_random_blocks,
                num_global=self.num_global,
                num_heads=self.num_heads,
                causal=causal,
                generator=generator,
                device=device,
            ),
        )

    # ------------------------------------------------------------------------------ forward
    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return ": its blocks pair aligned query and key positions (Lq == Lk)"
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        layout = self._layout(q.shape[2], causal, self._current_draw(), q.device)
        return bigbird_attention(
            q, k, v, layout, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        allowed = self.pattern(q.shape[2], causal=causal, device=q.device)
        return sparse_attention_reference(
            q, k, v, allowed[None], key_padding_mask=key_padding_mask, scale=self.scale
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"block_size={self.block_size}, num_window_blocks={self.num_window_blocks}, "
            f"num_random_blocks={self.num_random_blocks}, num_global={self.num_global}, "
            f"seed={self.seed}, scale={self.scale}"
        )


register_mechanism(
    "bigbird",
    BigBirdAttention,
    summary="Exact softmax over BigBird-ITC blocks: a window of blocks, random blocks (fixed "
    "in eval, redrawn in training) and global tokens.",
    reference="Zaheer et al., Big Bird: Transformers for Longer Sequences, NeurIPS 2020",
    complexity="O(L·(W + R)·b·D + G·L·D) time, O(L·(W + R + G/b)·b) memory (b = block_size, "
    "W window and R random blocks, G global tokens)",
    colour="#e6550d",
    approximates="softmax",
    size_option=None,
)
