"""Exact softmax attention with a relative positional bias and, on ℓ2-normalised queries and
keys, a learnable temperature: the attentions that Luo et al. 2021, §4.5 train and then convert
to kernelized attention without fine-tuning.

``z_i = Σ_j exp(l_ij) v_j / Σ_j exp(l_ij)`` with ``l_ij = τ_h · q̂_i·k̂_j + b_{j−i}``
(``normalize_qk=True``) or ``l_ij = scale · q_i·k_j + b_{j−i}`` (Luo et al. eq. 6; the scalar
bias per offset of Raffel et al. 2020). The bias is the log of the
coefficient ``c_{j−i}`` by which kernelized attention weights its terms (Luo et al. eq. 10):
both hold the same encoding module, so ``rpe.*`` state-dict entries move between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import positional
from ..checks import positive_float_or_none
from ..functional.softmax import KVCache, softmax_attention_reference, softmax_init_state
from ..functional.softmax_bias import biased_softmax_attention, biased_softmax_prefill
from ..registry import check_options, keyword_parameters, register_mechanism
from .encoded import EncodedAttention
from .rpe_options import build_aggregator, encoding_option_types, encoding_options
from .temperature import head_factor, init_temperature, temperature_repr

#: options of the encodings that only choose how kernelized attention sums its terms
_KERNELIZED_ONLY = ("rpe_method",)


class RelativeSoftmaxAttention(EncodedAttention):
    """Softmax attention with logits ``scale · q·k + b_{j−i}``, or ``τ_h · q̂·k̂ + b_{j−i}`` on
    normalised q and k; the bias is added to the logits before one masked
    ``scaled_dot_product_attention``. Decoding keeps a key/value cache and reads the bias
    row of each new position.

    Args:
        rpe: a relative positional encoding, as ``kernelized`` takes it: a name from
            ``kattn.positional.available()`` or a module from ``kattn.positional.build``
            (share one across layers by passing it to each), or None. Its
            ``dense_log(lq, lk)`` is the bias (``b = log c``), so its parameters are those
            of kernelized attention's ``rpe``. Decoding reads the rows of each new position
            from its ``decoding_rows`` (``toeplitz2d``: up to the last cell of its grid).
        normalize_qk: ℓ2-normalise q and k (the normalised attention of Luo et al. §4.5).
        scale: the logits' factor on ``q·k``; default ``1/√D``, or 1 with ``normalize_qk``.
        temperature: the initial ``τ_h`` (with ``normalize_qk``), multiplying ``scale``.
        learn_temperature: learn ``τ_h`` per head (``log_temperature``, shape ``(H,)``).
        dropout: dropout probability on the attention weights, applied in training only.
        **options: options of the encoding (``num_buckets``, ``max_distance``,
            ``bidirectional``, ``decay_terms``, ``grid``); not ``rpe_method``, which only
            chooses how kernelized attention sums its terms.
    """

    is_exact = True
    supports_recurrent = True
    supports_attention_dropout = True
    log_temperature: Tensor | None

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        rpe: str | positional.RelativePositionBias | None = None,
        normalize_qk: bool = False,
        scale: float | None = None,
        temperature: float = 1.0,
        learn_temperature: bool = False,
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(normalize_qk=normalize_qk, scale=scale)
        positive_float_or_none("scale", scale)
        aggregator = build_aggregator(rpe, num_heads, max_len, options, exclude=_KERNELIZED_ONLY)
        if options:
            valid = type(self).option_names({"rpe": rpe})
            check_options(type(self).__name__, options, valid)
        self.rpe = aggregator if isinstance(aggregator, positional.RelativePositionBias) else None
        self.normalize_qk = normalize_qk
        self.scale = (
            float(scale) if scale is not None else (1.0 if normalize_qk else head_dim**-0.5)
        )
        init_temperature(
            self,
            num_heads=num_heads,
            temperature=temperature,
            learn_temperature=learn_temperature,
            normalize_qk=normalize_qk,
        )
        self._set_dropout(dropout)
        self._set_capabilities(rpe=aggregator)
        self.limits_length = aggregator.needs_max_len

    # ------------------------------------------------------------------------- options
    @classmethod
    def option_names(cls, options: Mapping[str, Any]) -> list[str]:
        own = keyword_parameters(cls.__init__, exclude=("head_dim", "num_heads", "max_len"))
        return own + list(encoding_options(options.get("rpe"), exclude=_KERNELIZED_ONLY))

    @classmethod
    def option_types(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        own = super().option_types(options)
        own.update(encoding_option_types(options.get("rpe"), exclude=_KERNELIZED_ONLY))
        return own

    def _encoding(self) -> positional.RelativePositionBias | None:
        return self.rpe

    # ----------------------------------------------------------------------------- maths
    def _queries(self, q: Tensor) -> Tensor:
        """``scale · τ_h · q̂`` (or ``scale · q``): the logits are then ``q'·k'`` + bias."""
        q = F.normalize(q, dim=-1) if self.normalize_qk else q
        tau = head_factor(self.log_temperature, q)
        return q * self.scale if tau is None else q * (tau * self.scale)

    def _keys(self, k: Tensor) -> Tensor:
        return F.normalize(k, dim=-1) if self.normalize_qk else k

    def _bias(self, lq: int, lk: int) -> Tensor | None:
        """``(H, Lq, Lk)``: ``b_{j−i}``; None without an encoding."""
        return None if self.rpe is None else self.rpe.dense_log(lq, lk)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        if key_padding_mask is not None:  # a NaN in a padded key would survive F.normalize
            k = k.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        return biased_softmax_attention(
            self._queries(q),
            self._keys(k),
            v,
            self._bias(q.shape[2], k.shape[2]),
            causal=causal,
            key_padding_mask=key_padding_mask,
            scale=1.0,
            dropout_p=self.dropout_p,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        """The logits written out: ``scale · τ_h · q̂·k̂ + b_{j−i}`` (q and k normalised only
        with ``normalize_qk``), −∞ where a key is hidden, softmax, ``@ v``; rows that see no
        key give 0."""
        if self.normalize_qk:
            q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        q = q * self.scale
        if self.log_temperature is not None:
            q = q * torch.exp(self.log_temperature).to(q.dtype)[:, None, None]
        bias = None
        if self.rpe is not None:
            bias = self.rpe.dense_log(q.shape[2], k.shape[2]).to(q.dtype)
        return softmax_attention_reference(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=1.0, bias=bias
        )

    # ------------------------------------------------------------------------ decoding
    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> KVCache:
        return softmax_init_state(
            batch_size, self.num_heads, self.head_dim, device=device, dtype=dtype
        )

    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: KVCache
    ) -> tuple[Tensor, KVCache]:
        return self._prefill(q_t, k_t, v_t, state)

    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, state: KVCache) -> tuple[Tensor, KVCache]:
        """The L new queries (positions ``t0 …``) over the cached keys and the new ones, with
        the bias rows of their positions, ``rpe.decoding_rows(t0, L)`` ``(H, L, t0 + L)``."""
        t0 = state.length if isinstance(state, KVCache) else 0
        n = q.shape[2]
        bias = None
        if self.rpe is not None:
            bias = self.rpe.decoding_rows(t0, n)
        return biased_softmax_prefill(self._queries(q), self._keys(k), v, state, bias, scale=1.0)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"normalize_qk={self.normalize_qk}, scale={self.scale:.4g}"
            f"{temperature_repr(self.log_temperature)}, dropout={self.dropout}"
        )


register_mechanism(
    "softmax_rpe",
    RelativeSoftmaxAttention,
    defaults={"rpe": "toeplitz"},
    summary="Exact softmax attention with a learnable relative bias b_{j−i} added to the logits "
    "(the rpe= encodings of kernelized attention, same parameters); key/value-cache decoding.",
    reference="Raffel et al., Exploring the Limits of Transfer Learning with a Unified "
    "Text-to-Text Transformer, JMLR 2020; Luo et al., NeurIPS 2021 (eq. 6)",
    complexity="O(L²·D) time, O(L²) memory (the bias); O(t·D) per decoding step",
    colour="#525252",
)
register_mechanism(
    "normalized_softmax",
    RelativeSoftmaxAttention,
    defaults={"normalize_qk": True, "learn_temperature": True, "rpe": None},
    summary="Exact softmax over ℓ2-normalised queries and keys, exp(τ_h·q̂·k̂), with a learnable "
    "temperature per head; rpe='toeplitz' adds the relative bias. Converts to nprf_rpe "
    "(kattn.convert_attention).",
    reference="Luo et al., Stable, Fast and Accurate: Kernelized Attention with Relative "
    "Positional Encoding, NeurIPS 2021",
    complexity="O(L²·D) time; O(L) memory with fused kernels, O(L²) with a bias; O(t·D) per "
    "decoding step",
    colour="#969696",
)
