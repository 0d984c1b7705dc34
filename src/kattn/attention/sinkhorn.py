"""Sparse Sinkhorn attention (Tay, Bahri, Yang, Metzler, Juan, "Sparse Sinkhorn Attention",
ICML 2020): a learned soft permutation of blocks, Sinkhorn-balanced, brings to each block the
block it attends to besides itself.

How it differs from the paper and the released implementations (read, not copied):

- The sorting network reads the keys. The paper's SortNet pools the layer input X per block;
  a kattn mechanism receives projected heads only, so each head pools its own keys (the
  released Long Range Arena code also pools the keys, by a sum; lucidrains'
  ``sinkhorn-transformer`` pools queries and keys). Pooling is a mean over the real keys (the
  paper and LRA sum), and the network is one linear map per head, head_dim → ``max_blocks``
  logits cut to the N blocks present (as in LRA; the paper's SortNet may be deeper).
- One softmax over the sorted and the local block (as lucidrains); the LRA code adds two
  separately normalised softmaxes. The soft permutation is used in training and in
  evaluation (Gumbel noise only in training), as the paper describes; lucidrains keeps only
  the largest entry of each column of P, and LRA's default sorts by a plain softmax.
- Causal: the summary of block n is the mean of the keys up to its first token (LRA takes
  the first token, lucidrains the running mean), only earlier blocks can be sorted to place
  n (block 0 has only itself; lucidrains adds a learned null block), and the Sinkhorn
  column sums run over the rows up to n so that no row reads a later block (our reading of
  the paper's causal Sinkhorn balancing, whose exact form the released code leaves
  marked as unverified).
- SortCut attends to the first s sorted blocks only (the paper's formula); lucidrains adds
  the local block. It has no causal form.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import positive_float, positive_float_or_none, positive_int
from ..functional.numerics import accumulation_dtype
from ..functional.sinkhorn import (
    sinkhorn_allowed,
    sinkhorn_attention,
    sinkhorn_attention_reference,
    sinkhorn_block_summaries,
    sinkhorn_normalise,
)
from ..registry import register_mechanism
from .base import Attention


class SinkhornAttention(Attention):
    """Sparse Sinkhorn attention (Tay et al. 2020) with a per-head sorting network on the
    keys (:mod:`kattn.functional.sinkhorn`). O(L·b·D + N²·D) time, O(L·b + N²) memory for
    N = ⌈L/b⌉ blocks.

    Sorting: per head, block summaries s_n of the keys (the mean of the block's real keys;
    causal: of the real keys up to the block's first token) give logits
    ``R_n = s_n W + c`` over ``max_blocks = ⌈max_len / b⌉`` places, cut to N; in training
    Gumbel noise is added (the paper's Gumbel-Sinkhorn, from torch's global RNG); then
    ``P = Sinkhorn((R + noise) / temperature)`` with ``sinkhorn_iters`` row-and-column rounds.
    In ``eval()`` there is no noise, so the output is deterministic. P is soft in training and
    in evaluation. Query block n attends in one softmax to ``Σ_m P_nm K_m`` and to its own
    block (:func:`~kattn.functional.sinkhorn_attention`), or, with ``sortcut=s``, to the
    first s sorted blocks only.

    It approximates no attention (``approximates`` is None): the sorted block is a learned
    routing, not an estimate of a softmax over the whole sequence.

    Defaults: ``block_size=64`` (the Long Range Arena image configurations; LRA's text tasks
    use its model default of 50), ``sinkhorn_iters=5`` and ``temperature=0.75`` (lucidrains'
    defaults; the paper tunes both).

    Args:
        block_size: b, tokens per block.
        sinkhorn_iters: Sinkhorn row-and-column rounds.
        temperature: τ, the logits are divided by it.
        gumbel_noise: add Gumbel noise to the logits in training.
        sortcut: SortCut budget s in blocks (None: sorted and local block).
        scale: logit scale of the attention, default ``1/√D``.
    """

    supports_cross = False
    limits_length = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        block_size: int = 64,
        sinkhorn_iters: int = 5,
        temperature: float = 0.75,
        gumbel_noise: bool = True,
        sortcut: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            block_size=block_size,
            sinkhorn_iters=sinkhorn_iters,
            temperature=temperature,
            gumbel_noise=gumbel_noise,
            sortcut=sortcut,
            scale=scale,
        )
        assert max_len is not None
        self.block_size = positive_int("block_size", block_size)
        self.sinkhorn_iters = positive_int("sinkhorn_iters", sinkhorn_iters)
        self.temperature = positive_float("temperature", temperature)
        self.gumbel_noise = gumbel_noise
        self.sortcut = None if sortcut is None else positive_int("sortcut", sortcut)
        self.scale = positive_float_or_none("scale", scale)
        self.max_blocks = -(-max_len // block_size)
        self._set_capabilities(sortcut=sortcut)
        bound = 1.0 / math.sqrt(head_dim)  # nn.Linear's initialisation, per head
        self.sort_weight = nn.Parameter(
            torch.empty(num_heads, head_dim, self.max_blocks).uniform_(-bound, bound)
        )
        self.sort_bias = nn.Parameter(
            torch.empty(num_heads, self.max_blocks).uniform_(-bound, bound)
        )

    @classmethod
    def capabilities(cls, **options: Any) -> dict[str, bool]:
        """The class flags; no causal form with SortCut."""
        flags = super().capabilities(**options)
        flags["supports_causal"] = options.get("sortcut") is None
        return flags

    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return ": with SortCut every query reads the first sorted blocks, which mix all blocks"
        if capability == "cross":
            return ": the sorting pairs query blocks with key blocks of the same sequence"
        return ""

    # ------------------------------------------------------------------------------ sorting
    def sorting_matrix(
        self,
        k: Tensor,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """P ``(B, H, N, N)`` for keys k ``(B, H, L, D)`` (fp32 for half precision).

        ``noise``: Gumbel noise ``(B, H, N, N)`` to add to the logits; None draws it in
        training (when ``gumbel_noise``) and adds none in evaluation."""
        acc = accumulation_dtype(k.dtype)
        summaries, present = sinkhorn_block_summaries(
            k.to(acc), self.block_size, causal=causal, key_padding_mask=key_padding_mask
        )
        n = summaries.shape[2]
        weight = self.sort_weight[:, :, :n].to(acc)
        logits = torch.einsum("bhnd,hdm->bhnm", summaries, weight)  # (B, H, N, N)
        logits = logits + self.sort_bias[:, None, :n].to(acc)
        if noise is None and self.training and self.gumbel_noise:
            uniform = torch.rand(logits.shape, device=k.device, dtype=acc)
            tiny = torch.finfo(acc).tiny
            noise = -torch.log(-torch.log(uniform.clamp(tiny, 1.0 - 1e-7)))
        if noise is not None:
            logits = logits + noise.to(acc)
        return sinkhorn_normalise(
            logits / self.temperature,
            sinkhorn_allowed(present, causal=causal),
            iterations=self.sinkhorn_iters,
            causal=causal,
        )

    # ------------------------------------------------------------------------------ forward
    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        sorting = self.sorting_matrix(k, causal=causal, key_padding_mask=key_padding_mask)
        return sinkhorn_attention(q, k, v, sorting, **self._options(causal, key_padding_mask))

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        sorting = self.sorting_matrix(k, causal=causal, key_padding_mask=key_padding_mask)
        return sinkhorn_attention_reference(
            q, k, v, sorting, **self._options(causal, key_padding_mask)
        )

    def _options(self, causal: bool, key_padding_mask: Tensor | None) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "causal": causal,
            "key_padding_mask": key_padding_mask,
            "sortcut": self.sortcut,
            "scale": self.scale,
        }

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, max_len={self.max_len}, "
            f"block_size={self.block_size}, sinkhorn_iters={self.sinkhorn_iters}, "
            f"temperature={self.temperature}, gumbel_noise={self.gumbel_noise}, "
            f"sortcut={self.sortcut}, scale={self.scale}"
        )


register_mechanism(
    "sinkhorn",
    SinkhornAttention,
    summary="Sparse Sinkhorn attention: each block attends to itself and to a block brought "
    "by a learned, Sinkhorn-balanced soft permutation of blocks.",
    reference="Tay, Bahri, Yang, Metzler, Juan, Sparse Sinkhorn Attention, ICML 2020",
    complexity="O(L·b·D + N²·D) time, O(L·b + N²) memory (b = block_size, N = ⌈L/b⌉ blocks)",
    size_option=None,
    colour="#756bb1",
)
