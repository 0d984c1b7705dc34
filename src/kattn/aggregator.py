"""Aggregators of kernelized attention: how features and values are summed into outputs.

``z_i = φ(q_i)·Σ_j c_{j−i} φ(k_j) v_jᵀ / φ(q_i)·Σ_j c_{j−i} φ(k_j)`` (Luo et al., Stable, Fast
and Accurate: Kernelized Attention with Relative Positional Encoding, NeurIPS 2021, eq. 10).
:class:`Aggregator` is the interface :class:`~kattn.attention.kernelized.KernelizedAttention`
calls; :class:`LinearAggregator` is the case without positional weights (every ``c = 1``, the
linear attention of Katharopoulos et al. 2020 and Luo et al. eq. 3); the relative positional
encodings of :mod:`kattn.positional` are the others.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .functional.linear import linear_attention
from .functional.linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    LinearState,
    linear_attention_init_state,
    linear_attention_prefill,
)
from .functional.linear_step import linear_attention_step
from .functional.numerics import DEFAULT_EPS


class Aggregator(nn.Module):
    """The sums of kernelized attention over features ``φ(q)`` ``(B, H, Lq, M)``,
    ``φ(k)·exp(k_log_scale)`` ``(B, H, Lk, M)`` and values ``(B, H, Lk, Dv)``, with positional
    weights ``c_{j−i} > 0``.

    Subclasses implement :meth:`attend` (shapes as :func:`kattn.functional.linear_attention`)
    and, when ``supports_recurrent``, :meth:`init_state` and :meth:`step`; :meth:`prefill` runs
    :meth:`step` token by token unless overridden by a parallel form. The capability flags are
    class attributes, so a mechanism reads them without building one.
    """

    #: ``init_state``/``step`` exist (decoding one token at a time).
    supports_recurrent: bool = True
    #: Lq != Lk is allowed.
    supports_cross: bool = True
    #: the parameters depend on ``max_len`` (longer sequences are refused).
    needs_max_len: bool = False

    def check_lengths(self, lq: int, lk: int) -> None:
        """Raise ``ValueError`` for lengths the aggregator does not cover (any, here)."""

    def dense_log(self, lq: int, lk: int) -> Tensor | None:
        """``(H, Lq, Lk)``: ``log c_{j−i}`` for query i and key j; None when every ``c`` is 1."""
        return None

    def attend(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        *,
        causal: bool = False,
        k_log_scale: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        eps: float = DEFAULT_EPS,
        positive_features: bool = False,
    ) -> Tensor:
        """Kernelized attention ``(B, H, Lq, Dv)`` (``positive_features``: every weight is >= 0,
        so each output is a convex combination of values)."""
        raise NotImplementedError

    def init_state(
        self, batch_size: int, num_features: int, *, device: Any, dtype: torch.dtype
    ) -> Any:
        """The decoding state before any token."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form")

    def step(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: Any,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
    ) -> tuple[Tensor, Any]:
        """One causal token: output ``(B, H, 1, Dv)`` and the new state."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form")

    def prefill(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: Any,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
        **kwargs: Any,
    ) -> tuple[Tensor, Any]:
        """L causal tokens after ``state``: output ``(B, H, L, Dv)`` and the state after them.

        Token by token through :meth:`step`; aggregators with a parallel form override it
        (``kwargs``: ``chunk_size``/``block_size`` of that form)."""
        outs = []
        for t in range(phi_q.shape[2]):
            scale = None if k_log_scale is None else k_log_scale[:, :, t : t + 1]
            out, state = self.step(
                phi_q[:, :, t : t + 1],
                phi_k[:, :, t : t + 1],
                v[:, :, t : t + 1],
                state,
                k_log_scale=scale,
                eps=eps,
            )
            outs.append(out)
        return torch.cat(outs, dim=2), state


class LinearAggregator(Aggregator):
    """No positional weights (every ``c = 1``): ``z_i = φ(q_i)·Σ_j φ(k_j) v_jᵀ / φ(q_i)·Σ_j
    φ(k_j)`` (Katharopoulos et al., Transformers are RNNs, ICML 2020; Luo et al. 2021 eq. 3),
    by the functions of :mod:`kattn.functional`: O(L·M·Dv) non-causal, chunkwise-parallel
    causal, O(M·Dv) per recurrent step. No parameters.
    """

    def __init__(self, *, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    def attend(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        *,
        causal: bool = False,
        k_log_scale: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        eps: float = DEFAULT_EPS,
        positive_features: bool = False,
    ) -> Tensor:
        """:func:`kattn.functional.linear_attention` (``positive_features`` is not needed)."""
        return linear_attention(
            phi_q,
            phi_k,
            v,
            causal=causal,
            k_log_scale=k_log_scale,
            key_padding_mask=key_padding_mask,
            chunk_size=chunk_size,
            block_size=block_size,
            eps=eps,
        )

    def init_state(
        self, batch_size: int, num_features: int, *, device: Any, dtype: torch.dtype
    ) -> LinearState:
        """The empty :class:`~kattn.functional.LinearState`; its value dim is unknown until the
        first step, so kv starts empty and grows to ``(B, H, M, Dv)`` then."""
        return linear_attention_init_state(
            batch_size, self.num_heads, num_features, 0, device=device, dtype=dtype
        )

    def step(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: LinearState,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
    ) -> tuple[Tensor, LinearState]:
        """:func:`kattn.functional.linear_attention_step`."""
        return linear_attention_step(phi_q, phi_k, v, state, k_log_scale=k_log_scale, eps=eps)

    def prefill(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: LinearState,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        **kwargs: Any,
    ) -> tuple[Tensor, LinearState]:
        """:func:`kattn.functional.linear_attention_prefill` (chunkwise parallel)."""
        return linear_attention_prefill(
            phi_q,
            phi_k,
            v,
            state,
            k_log_scale=k_log_scale,
            chunk_size=chunk_size,
            block_size=block_size,
            eps=eps,
            **kwargs,
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
