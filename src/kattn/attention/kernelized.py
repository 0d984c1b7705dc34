"""Kernelized attention: any registered feature map φ with an aggregator of the sums.

``z_i = φ(q_i)·Σ_j φ(k_j) v_jᵀ / φ(q_i)·Σ_j φ(k_j)`` (Luo et al. 2021 eq. 3), non-causal in
O(L·M·Dv), causal in chunkwise-parallel form, and recurrent with an O(M·Dv) state; with a
relative positional encoding (``rpe=``) each term is weighted by ``c_{j−i}`` (Luo et al. eq. 10).
Both are :class:`~kattn.aggregator.Aggregator` s: :class:`~kattn.aggregator.LinearAggregator`
without an encoding, the encoding module with one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import positional
from ..aggregator import Aggregator, LinearAggregator
from ..functional.linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE
from ..ops.triton.dispatch import check_backend, refuse_uncovered, select_aggregator
from ..registry import register_mechanism
from .base import sums_in_float32
from .encoded import EncodedAttention
from .feature_attention import FeatureMapAttention
from .rpe_options import build_aggregator, encoding_option_types, rpe_option_names
from .temperature import head_factor, init_temperature, temperature_repr


class KernelizedAttention(EncodedAttention, FeatureMapAttention):
    """Kernelized (linear) attention with a pluggable feature map.

    Args:
        feature_map: a name from ``kattn.features.available()``.
        normalize_qk: ℓ2-normalise q and k before φ (NPRF, Luo et al. 2021 §3.3).
        temperature: with ``normalize_qk``, the initial ``τ_h``: the kernel sees
            ``scale · τ_h · q̂·k̂`` (q̂ and k̂ each multiplied by ``√τ_h``), as
            ``normalized_softmax``'s logits, whose parameter converts to this one.
        learn_temperature: learn ``τ_h`` per head (``log_temperature``, shape ``(H,)``).
        scale: the kernel sees ``scale · q·k``: q and k are each multiplied by ``√scale``.
            Default: ``1/√D`` for maps that estimate ``exp(q·k)`` (as softmax does) and for the
            learned spectral maps (as their released code), else 1
            (also 1 with ``normalize_qk``, where ``q̂·k̂ ∈ [−1, 1]``).
        chunk_size: tokens per chunk of the causal chunkwise-parallel form.
        block_size: tokens per block of chunks computed together (memory/speed trade-off).
        eps: guard of the normaliser, ``|den| >= eps`` in units where the query's largest
            feature and the largest key weight are 1. Default: 1e-30 for positive feature maps
            (only a zero normaliser is caught), 1e-6 for signed ones (identity, trf).
        rpe: a relative positional encoding: a name from ``kattn.positional.available()``
            (``"toeplitz"``, ``"bucketed"``, ``"decay"``, ``"toeplitz2d"``) or a module from
            ``kattn.positional.build`` (share one module across layers by passing it to each).
            The module is ``attn.rpe`` (None without one) and ``attn.aggregator``; without
            one ``attn.aggregator`` is a :class:`~kattn.aggregator.LinearAggregator`.
        backend: what computes the sums: ``"auto"`` (the Triton kernels on CUDA tensors when
            triton imports and they cover the call, else PyTorch), ``"triton"`` (the kernels,
            or ``NotImplementedError`` saying why a call is not covered: an encoding without a
            kernel, such as ``"toeplitz2d"`` or ``rpe_method="fft"``, already at construction;
            an encoding's decoding step) or ``"torch"``; see :mod:`kattn.ops.triton.dispatch`.
            The kernels' backward is their own; a backward with ``create_graph=True`` (a
            gradient penalty) recomputes the PyTorch path's graph instead, so second
            derivatives are those of ``"torch"``. Half-precision inputs run the kernels'
            products on tensor cores in TF32 with fp32 sums (docs/performance.md).
        **options: options of the feature map (e.g. ``num_features``, ``sampling``, ``redraw``
            for ``prf``/``trf``) and of the encoding (``rpe_method``, ``num_buckets``,
            ``max_distance``, ``bidirectional``, ``decay_terms``, ``grid``).
    """

    supports_recurrent = True
    log_temperature: Tensor | None

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        feature_map: str = "elu",
        normalize_qk: bool = False,
        temperature: float = 1.0,
        learn_temperature: bool = False,
        scale: float | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        eps: float | None = None,
        rpe: str | positional.RelativePositionBias | None = None,
        backend: str = "auto",
        **options: Any,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self.backend = check_backend(backend)
        self._check_option_types(normalize_qk=normalize_qk, scale=scale, eps=eps)
        aggregator = build_aggregator(rpe, num_heads, max_len, options)
        # An encoding is the submodule ``rpe`` (its state_dict keys and the public attribute);
        # the plain aggregator has no parameters and is not registered (see ``aggregator``).
        self.rpe = aggregator if isinstance(aggregator, positional.RelativePositionBias) else None
        self._build_feature_map(
            feature_map, scale=scale, eps=eps, chunk_size=chunk_size, block_size=block_size,
            normalized=normalize_qk, options=options,
        )  # fmt: skip
        self.normalize_qk = normalize_qk
        init_temperature(
            self,
            num_heads=num_heads,
            temperature=temperature,
            learn_temperature=learn_temperature,
            normalize_qk=normalize_qk,
        )
        self._set_capabilities(rpe=aggregator)
        refuse_uncovered(self.backend, aggregator)
        self.limits_length = aggregator.needs_max_len

    @property
    def aggregator(self) -> Aggregator:
        """The sums over keys: the encoding ``rpe``, or a plain ``LinearAggregator`` (made once,
        not a child module: nothing in ``state_dict`` or ``repr``)."""
        if self.rpe is not None:
            return self.rpe
        plain = self.__dict__.get("_linear_aggregator")
        if plain is None:
            plain = self.__dict__["_linear_aggregator"] = LinearAggregator(num_heads=self.num_heads)
        return plain

    @classmethod
    def option_names(cls, options: Mapping[str, Any]) -> list[str]:
        own = super().option_names(options)
        rpe = options.get("rpe")
        if isinstance(rpe, str) and rpe in positional.available():
            own = own + list(rpe_option_names(rpe))
        return own

    @classmethod
    def option_types(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        own = super().option_types(options)
        own.update(encoding_option_types(options.get("rpe")))
        return own

    def _encoding(self) -> Aggregator:
        return self.aggregator

    def _aggregator_for(
        self,
        x: Tensor,
        call: str,
        *,
        causal: bool = True,
        tensors: tuple[object, ...] = (),
        features: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> Aggregator:
        """The aggregator ``backend`` runs this call with (``"attend"``, ``"step"`` or
        ``"prefill"`` on inputs like ``x``; ``features`` its ``(phi_q, phi_k, v)``): the
        Triton kernels or :attr:`aggregator`."""
        return select_aggregator(
            self.backend, self.aggregator, x, call=call, causal=causal,
            chunk_size=self.chunk_size, tensors=tensors, features=features,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ maths
    def _prepare(self, x: Tensor) -> Tensor:
        """x in the accumulation dtype; normalised, and times ``√τ_h``, with ``normalize_qk``."""
        x = super()._prepare(x)
        if not self.normalize_qk:
            return x
        x = F.normalize(x, dim=-1)
        root_tau = head_factor(self.log_temperature, x, power=0.5)
        return x if root_tau is None else x * root_tau

    @sums_in_float32
    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        if self.training:
            self.feature_map.training_step()
        fk = self.features(k)
        fq = self.query_features(q)
        features = (fq, fk.values, v)
        return self._aggregator_for(v, "attend", causal=causal, features=features).attend(
            fq,
            fk.values,
            v,
            causal=causal,
            k_log_scale=fk.log_scale,
            key_padding_mask=key_padding_mask,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
            eps=self.eps,
            positive_features=self.feature_map.positive,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        """``(W ⊙ φ̃(Q)φ̃(K)ᵀ) V`` normalised row-wise, with φ̃ the bounded feature values
        (``φ(k_j) = φ̃(k_j) exp(s_j)``, s the key log-scales) and the dense ``(Lq, Lk)`` weights
        ``W_ij = c_{j−i} exp(s_j − m_i)`` (c the encoding's coefficients, 1 without one; m_i
        the largest ``log c_{j−i} + s_j`` over the keys query i sees).

        The shift m_i cancels in the ratio and keeps every weight at most 1 whatever the
        norms; it also puts ``eps`` in the units the fast paths use (largest query feature
        and largest visible key weight 1), so the guard bites on the same rows. Rows that
        see no key give 0. The FFT path clamps outputs of positive maps to the values' range;
        the exact ratio is a convex combination already, so nothing is clamped here."""
        fq = self.features(q).values  # the query's own log-scale cancels in the ratio
        fk = self.features(k)
        lq, lk = q.shape[2], k.shape[2]
        acc = fk.values.dtype
        log_w = torch.zeros(1, 1, lq, lk, device=q.device, dtype=acc)
        log_c = self.aggregator.dense_log(lq, lk)  # (H, Lq, Lk), None when every c is 1
        if log_c is not None:
            log_w = log_w + log_c.to(acc)
        return self._weighted_reference(
            fq, fk, v, log_w, causal=causal, key_padding_mask=key_padding_mask
        )

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> Any:
        num_features = self.feature_map.num_features
        return self.aggregator.init_state(batch_size, num_features, device=device, dtype=dtype)

    @sums_in_float32
    def _step(self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        fk = self.features(k_t)
        fq = self.query_features(q_t)
        aggregator = self._aggregator_for(v_t, "step", tensors=(fq, *fk, v_t, state))
        return aggregator.step(fq, fk.values, v_t, state, k_log_scale=fk.log_scale, eps=self.eps)

    @sums_in_float32
    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, state: Any) -> tuple[Tensor, Any]:
        fk = self.features(k)
        fq = self.query_features(q)
        features = (fq, fk.values, v)
        aggregator = self._aggregator_for(
            v, "prefill", tensors=(fq, *fk, v, state), features=features
        )
        return aggregator.prefill(
            fq,
            fk.values,
            v,
            state,
            k_log_scale=fk.log_scale,
            chunk_size=self.chunk_size,
            block_size=self.block_size,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"feature_map={self.feature_map_name!r}, normalize_qk={self.normalize_qk}, "
            f"scale={self.scale:.4g}{temperature_repr(self.log_temperature)}"
            + ("" if self.backend == "auto" else f", backend={self.backend!r}")
        )


register_mechanism(
    "kernelized",
    KernelizedAttention,
    summary="Kernelized attention with any feature map (feature_map=...); normalised q/k option.",
    reference="Katharopoulos et al., Transformers are RNNs, ICML 2020; Luo et al., NeurIPS 2021",
    complexity="O(L·M·Dv) time and memory; causal chunkwise O(L·C·(M+Dv)); O(M·Dv) per step",
    colour="#9edae5",
)
register_mechanism(
    "nprf_rpe",
    KernelizedAttention,
    defaults={"feature_map": "prf", "normalize_qk": True, "rpe": "toeplitz"},
    summary="NPRF-Transformer with RPE: normalised q/k, positive random features, a learnable "
    "relative bias per offset, computed by FFT.",
    reference="Luo et al., Stable, Fast and Accurate: Kernelized Attention with Relative "
    "Positional Encoding, NeurIPS 2021",
    complexity="O(L log L·M·Dv) by FFT, or exact O(L²·(M+Dv)) in blocks of queries (O(L) memory "
    "per block row), whichever is faster; decoding O(t·(M+Dv))",
    approximates="softmax_unit_qk",
    size_option="num_features",
    colour="#2ca02c",
)
register_mechanism(
    "prf_rpe",
    KernelizedAttention,
    defaults={"feature_map": "prf", "rpe": "toeplitz"},
    summary="PRF kernelized attention with a learnable relative bias per offset, by FFT "
    "(no q/k normalisation).",
    reference="Luo et al., Stable, Fast and Accurate: Kernelized Attention with Relative "
    "Positional Encoding, NeurIPS 2021",
    complexity="O(L log L·M·Dv) by FFT, or exact O(L²·(M+Dv)) in blocks of queries (O(L) memory "
    "per block row), whichever is faster; decoding O(t·(M+Dv))",
    approximates="softmax",
    size_option="num_features",
    colour="#98df8a",
)
register_mechanism(
    "linear",
    KernelizedAttention,
    defaults={"feature_map": "elu"},
    summary="Linear attention with φ = elu + 1.",
    reference="Katharopoulos et al., Transformers are RNNs, ICML 2020",
    complexity="O(L·D·Dv) time and memory; O(D·Dv) per recurrent step",
    colour="#17becf",
)
register_mechanism(
    "performer",
    KernelizedAttention,
    defaults={"feature_map": "prf"},
    summary="Performer / FAVOR+: positive orthogonal random features estimating softmax.",
    reference="Choromanski et al., Rethinking Attention with Performers, ICLR 2021",
    complexity="O(L·M·(D+Dv)) time, O(L·M + M·Dv) memory; O(M·Dv) per recurrent step",
    approximates="softmax",
    size_option="num_features",
    colour="#1f77b4",
)
register_mechanism(
    "rfa",
    KernelizedAttention,
    defaults={"feature_map": "trf"},
    summary="Random feature attention: trigonometric random features estimating softmax.",
    reference="Peng et al., Random Feature Attention, ICLR 2021",
    complexity="O(L·M·(D+Dv)) time, O(L·M + M·Dv) memory; O(M·Dv) per recurrent step",
    approximates="softmax",
    size_option="num_features",
    colour="#aec7e8",
)
