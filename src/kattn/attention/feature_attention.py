"""What every attention through a registered feature map φ shares: building φ and checking
its options, the default logit scale and normaliser guard, φ of keys and of queries in the
accumulation dtype, and φ's penalty. Kernelized attention and RFA-Gate build on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .. import features as feature_maps
from .. import functional as lin
from ..checks import positive_float_or_none, positive_int
from ..features.base import FEATURE_MAPS
from ..functional.numerics import DEFAULT_EPS, POSITIVE_EPS, autocast_off, log_floor
from ..registry import declared_types, keyword_parameters
from .base import Attention


class FeatureMapAttention(Attention):
    """An attention whose keys and queries go through ``self.feature_map``.

    Attributes:
        default_feature_map: the map when the options name none (for the option lists).
    """

    default_feature_map = "elu"

    def _build_feature_map(
        self,
        feature_map: str,
        *,
        scale: float | None,
        eps: float | None,
        chunk_size: int,
        block_size: int,
        normalized: bool = False,
        options: dict[str, Any],
    ) -> None:
        """Build φ from ``options`` and set ``feature_map``, ``feature_map_name``, ``scale``
        (default ``1/√D`` for maps that estimate ``exp(q·k)`` and the learned spectral maps,
        unless q and k are ``normalized``; else 1), ``eps`` (default 1e-30 for positive maps,
        1e-6 for signed ones), ``chunk_size`` and ``block_size``."""
        if not isinstance(feature_map, str):
            raise TypeError(
                f"feature_map must be a registered name (str), got {type(feature_map).__name__}"
            )
        positive_float_or_none("scale", scale)
        positive_int("chunk_size", chunk_size)
        positive_int("block_size", block_size)
        positive_float_or_none("eps", eps)
        self.feature_map = feature_maps.build(
            feature_map, head_dim=self.head_dim, num_heads=self.num_heads, **options
        )
        self.feature_map_name = feature_map
        if scale is None:
            fm = self.feature_map
            softmax_like = (fm.softmax_scaling or fm.approximates_softmax) and not normalized
            scale = self.head_dim**-0.5 if softmax_like else 1.0
        self.scale = float(scale)
        self.chunk_size, self.block_size = chunk_size, block_size
        if eps is None:
            eps = POSITIVE_EPS if self.feature_map.positive else DEFAULT_EPS
        self.eps = float(eps)

    @classmethod
    def option_names(cls, options: Mapping[str, Any]) -> list[str]:
        own = keyword_parameters(cls.__init__, exclude=("head_dim", "num_heads", "max_len"))
        name = options.get("feature_map", cls.default_feature_map)
        if isinstance(name, str) and name in feature_maps.available():
            own = own + feature_maps.option_names(name)
        return own

    @classmethod
    def option_types(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        own = super().option_types(options)
        name = options.get("feature_map", cls.default_feature_map)
        if isinstance(name, str) and name in feature_maps.available():
            fm_cls = FEATURE_MAPS.get(name).cls
            own.update(declared_types(fm_cls.__init__, exclude=("head_dim", "num_heads")))
        return own

    def _prepare(self, x: Tensor) -> Tensor:
        """x as φ reads it: in the accumulation dtype."""
        return x.to(lin.accumulation_dtype(x.dtype))

    def features(self, x: Tensor) -> feature_maps.Features:
        """φ of keys (or queries) ``(B, H, L, D)``, computed in fp32 (fp64 stays fp64; autocast
        is off inside, so phases and exponents are never computed in half precision)."""
        with autocast_off(x):
            return self.feature_map(self._prepare(x), self.scale)

    def query_features(self, x: Tensor) -> Tensor:
        """φ of queries up to a positive factor per row (it cancels in the ratio)."""
        with autocast_off(x):
            return self.feature_map.query_values(self._prepare(x), self.scale)

    def _weighted_reference(
        self,
        fq: Tensor,
        fk: feature_maps.Features,
        v: Tensor,
        log_w: Tensor,
        *,
        causal: bool,
        key_padding_mask: Tensor | None,
    ) -> Tensor:
        """The dense reference ``(W ⊙ φ̃(Q)φ̃(K)ᵀ) V`` normalised row-wise, from the log of
        the pair weights ``log_w`` ``(…, Lq, Lk)`` before the keys' log-scales s: ``W_ij =
        exp(log_w_ij + s_j − m_i)``, masked keys left out, m_i the row's largest visible
        exponent (it cancels in the ratio and puts ``eps`` in the units of the fast paths)."""
        if fk.log_scale is not None:
            log_w = log_w + fk.log_scale[:, :, None, :]  # (B, H, Lq, Lk)
        allowed = lin.allowed_keys(
            fq.shape[2], fk.values.shape[2], causal=causal, key_padding_mask=key_padding_mask,
            device=fq.device,
        )  # fmt: skip
        if allowed is not None:
            log_w = log_w.masked_fill(~allowed, log_floor(log_w.dtype))
        weights = torch.exp(log_w - log_w.detach().amax(dim=-1, keepdim=True))
        return lin.linear_attention_reference(
            fq, fk.values, v, causal=causal, key_padding_mask=key_padding_mask, coeff=weights,
            eps=self.eps,
        )  # fmt: skip

    def regularization_loss(self) -> Tensor:
        return self.feature_map.regularization_loss()
