"""The decoder block of :class:`~kattn.nn.seq2seq.Seq2Seq` and its cross-attention cache.

A decoder block (Vaswani et al. 2017, §3.1) is causal self-attention, cross-attention over the
encoder's output (the *memory*) and a GELU MLP, each a residual sublayer, pre-LN or post-LN.
For incremental decoding, :func:`cross_cache` projects the memory once per source into a
:class:`CrossCache` and :func:`cross_attend` reads it every step: keys and values, or for
kernelized attention without a relative encoding the feature sums ``Σ_j φ(k_j) v_jᵀ`` and
``Σ_j φ(k_j)`` (Luo et al. 2021 eq. 3), so that a step costs O(M·Dv) whatever the source length.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.kernelized import KernelizedAttention
from ..functional.numerics import (
    autocast_off,
    guard_normaliser,
    prepare_linear_inputs,
    scaled_key_features,
)
from .multihead import MultiheadAttention


@dataclass
class CrossCache:
    """What one decoder layer's cross-attention keeps of the source, computed once.

    Attributes:
        keys, values: projected heads ``(B, H, Ls, D)``, ``(B, H, Ls, Dv)`` (None where the
            sums below replace them); padding: the source padding mask ``(B, Ls)`` or None.
        kv, k_sum: for kernelized attention without a relative encoding, the sums
            ``Σ_j φ(k_j) v_jᵀ`` ``(B, H, M, Dv)`` and ``Σ_j φ(k_j)`` ``(B, H, M)`` over the
            non-padded source tokens (Luo et al. 2021 eq. 3): a step then costs O(M·Dv),
            whatever the source length.
    """

    keys: Tensor | None = None
    values: Tensor | None = None
    padding: Tensor | None = None
    kv: Tensor | None = None
    k_sum: Tensor | None = None

    def select(self, index: Tensor) -> CrossCache:
        """The cache of the batch rows ``index`` (new tensors)."""
        chosen = {f.name: getattr(self, f.name) for f in fields(self)}
        return CrossCache(**{n: None if x is None else x[index] for n, x in chosen.items()})


def _heads(x: Tensor, num_heads: int) -> Tensor:
    b, length, e = x.shape
    return x.view(b, length, num_heads, e // num_heads).transpose(1, 2)  # (B, H, L, D)


def _in_projection(mha: MultiheadAttention, x: Tensor, part: int) -> Tensor:
    """The query (0), key (1) or value (2) projection of ``mha`` applied to ``x``."""
    e = mha.embed_dim
    bias = None if mha.in_proj_bias is None else mha.in_proj_bias[part * e : (part + 1) * e]
    if mha.in_proj_weight is not None:
        weight = mha.in_proj_weight[part * e : (part + 1) * e]
    else:
        weight = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)[part]
    return F.linear(x, weight, bias)


def cross_cache(mha: MultiheadAttention, memory: Tensor, padding: Tensor | None) -> CrossCache:
    """Project ``memory (B, Ls, dim)`` once: keys and values, or for kernelized attention
    without a relative encoding the feature sums (see :class:`CrossCache`)."""
    k = _heads(_in_projection(mha, memory, 1), mha.num_heads)
    v = _heads(_in_projection(mha, memory, 2), mha.num_heads)
    attn = mha.attention
    if not isinstance(attn, KernelizedAttention) or attn.rpe is not None:
        return CrossCache(keys=k, values=v, padding=padding)
    with autocast_off(k):
        fk = attn.features(k)
        _, phi_k, v_acc, log_scale = prepare_linear_inputs(
            fk.values, fk.values, v, fk.log_scale, padding
        )
        phi_k = scaled_key_features(phi_k, log_scale)
        return CrossCache(kv=phi_k.transpose(-1, -2) @ v_acc, k_sum=phi_k.sum(dim=2))


def cross_attend(mha: MultiheadAttention, x: Tensor, cache: CrossCache) -> Tensor:
    """Cross-attention of queries ``x (B, Lt, dim)`` over a cached source: ``(B, Lt, dim)``,
    equal to ``mha(x, memory, memory, key_padding_mask=padding)`` for mechanisms whose output
    row depends on its own query only."""
    q = _heads(_in_projection(mha, x, 0), mha.num_heads)
    attn = mha.attention
    if cache.kv is not None and cache.k_sum is not None:
        assert isinstance(attn, KernelizedAttention)
        with autocast_off(q):
            phi_q = attn.query_features(q).to(cache.kv.dtype)
            den = guard_normaliser(phi_q @ cache.k_sum[..., None], attn.eps)
            out = ((phi_q @ cache.kv) / den).to(q.dtype)  # (B, H, Lt, Dv)
    else:
        assert cache.keys is not None and cache.values is not None
        out = attn(q, cache.keys, cache.values, key_padding_mask=cache.padding)
    b, _, length, _ = out.shape
    return mha.out_proj(out.transpose(1, 2).reshape(b, length, mha.embed_dim))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the memory and a GELU MLP, with dropout
    Drop, pre-LN (``x + Drop(f(LN(x)))`` per sublayer) or post-LN (``LN(x + Drop(f(x)))``).

    Args:
        dim, num_heads, ffn_dim: the shape; max_len: for mechanisms that need it.
        self_attention, cross_attention: mechanism names; self_options, cross_options: theirs.
        dropout, attention_dropout, norm_first: as :class:`~kattn.nn.encoder.EncoderLayer`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        self_attention: str,
        cross_attention: str,
        max_len: int,
        self_options: dict[str, Any],
        cross_options: dict[str, Any],
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        common: dict[str, Any] = {"dropout": attention_dropout, "batch_first": True}
        self.self_attn = MultiheadAttention(
            dim, num_heads, mechanism=self_attention, max_len=max_len, **common, **self_options
        )
        self.cross_attn = MultiheadAttention(
            dim, num_heads, mechanism=cross_attention, max_len=max_len, **common, **cross_options
        )
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3))
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim)
        )
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def _sublayer(self, x: Tensor, i: int, f: Any) -> Tensor:
        norm = self.norms[i]
        if self.norm_first:
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_padding_mask: Tensor | None = None,
        src_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """``x (B, Lt, dim)``, ``memory (B, Ls, dim)``; masks ``(B, L)`` bool, True = pad."""
        x = self._sublayer(
            x, 0, lambda h: self.self_attn(h, key_padding_mask=tgt_padding_mask, is_causal=True)[0]
        )
        x = self._sublayer(
            x, 1, lambda h: self.cross_attn(h, memory, key_padding_mask=src_padding_mask)[0]
        )
        return self._sublayer(x, 2, self.ffn)

    def decode(self, x: Tensor, state: Any, cache: CrossCache) -> tuple[Tensor, Any]:
        """New target tokens ``x (B, L, dim)`` after the self-attention ``state`` (None: the
        first), over the cached source; the output and the new state."""
        new_state = [state]

        def attend(h: Tensor) -> Tensor:
            out, new_state[0] = self.self_attn.decode(h, state)
            return out

        x = self._sublayer(x, 0, attend)
        x = self._sublayer(x, 1, lambda h: cross_attend(self.cross_attn, h, cache))
        return self._sublayer(x, 2, self.ffn), new_state[0]

    def reread(self, x: Tensor, cache: CrossCache) -> Tensor:
        """The whole target prefix ``x (B, Lt, dim)`` over the cached source (decoding with
        mechanisms that have no recurrent form)."""
        x = self._sublayer(x, 0, lambda h: self.self_attn(h, is_causal=True)[0])
        x = self._sublayer(x, 1, lambda h: cross_attend(self.cross_attn, h, cache))
        return self._sublayer(x, 2, self.ffn)
