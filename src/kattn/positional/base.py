"""The base class of relative positional encodings inside kernelized attention."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..aggregator import Aggregator
from ..checks import is_positive_int, positive_int
from ..functional.banded_decoding import BandedState, banded_init_state, banded_step
from ..functional.linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE
from ..functional.numerics import DEFAULT_EPS
from ..functional.rpe_blocked import (
    RowLogCoefficients,
    ToeplitzRows,
    prefer_blocked,
    rpe_linear_attention_blocked,
)
from ..functional.toeplitz import fft_length, rpe_linear_attention_fft, toeplitz_dense


class RelativePositionBias(Aggregator):
    """Positional weights ``c_{j−i} = exp(b_{j−i}) > 0`` that multiply the kernel of kernelized
    attention: ``z_i = Σ_j c_{j−i} φ(q_i)·φ(k_j) v_j / Σ_j c_{j−i} φ(q_i)·φ(k_j)``.

    Subclasses define the log-coefficients ``b`` (:meth:`log_coefficients`, or
    :meth:`dense_log` for 2-D grids) and the fast paths of their ``methods``; ``"dense"``, the
    O(Lq·Lk) reference, is always available. Parameters are per head (``num_heads``). One
    module may be shared by every layer of a model (pass the module as ``rpe=``). The
    capability flags (``supports_recurrent``, ``supports_cross``, ``needs_max_len``) and the
    recurrent methods (``init_state``, ``step``, ``prefill``) are those of
    :class:`~kattn.aggregator.Aggregator`.
    """

    #: computation paths; the first is the default.
    methods: tuple[str, ...] = ("dense",)

    def __init__(self, *, num_heads: int, max_len: int | None = None, method: str | None = None):
        super().__init__()
        positive_int("num_heads", num_heads)
        if self.needs_max_len and not is_positive_int(max_len):
            raise ValueError(
                f"{type(self).__name__} needs max_len (a positive int: its parameters cover "
                f"offsets up to max_len − 1), got {max_len!r}"
            )
        method = self.methods[0] if method is None else method
        if method not in self.methods:
            raise ValueError(f"method must be one of {self.methods}, got {method!r}")
        self.num_heads = num_heads
        self.max_len = max_len
        self.method = method

    # ------------------------------------------------------------------------- coefficients
    def log_coefficients(self, lq: int, lk: int) -> Tensor:
        """``(H, lq + lk − 1)`` log-coefficients ``b`` of the offsets ``−(lq−1)…lk−1``."""
        raise NotImplementedError

    def dense_log(self, lq: int, lk: int) -> Tensor:
        """``(H, Lq, Lk)``: ``b_{j−i}`` for query i and key j."""
        return toeplitz_dense(self.log_coefficients(lq, lk), lq, lk)

    def row_log_coefficients(self, lq: int, lk: int) -> RowLogCoefficients:
        """``rows(i0, i1, kv)``: the log-coefficients of queries i0..i1−1 and keys 0..kv−1."""
        return ToeplitzRows(self.log_coefficients(lq, lk), lq)

    def decoding_rows(self, start: int, length: int) -> Tensor:
        """``(H, length, start + length)``: the log-coefficients of the queries ``start …
        start + length − 1`` over the keys ``0 … start + length − 1`` (the bias rows that
        decoding with a key/value cache reads); ``ValueError`` beyond the encoding's range."""
        end = start + length
        self.check_lengths(end, length)
        return toeplitz_dense(self.log_coefficients(end, length), length, end)

    def dense(self, lq: int, lk: int, causal: bool = False) -> Tensor:
        """The ``(H, Lq, Lk)`` matrix ``C = [exp(b_{j−i})]`` (zeros above the diagonal when
        ``causal``), for plots and tests."""
        self.check_lengths(lq, lk)
        coeff = torch.exp(self.dense_log(lq, lk))
        return coeff.tril() if causal else coeff

    def check_lengths(self, lq: int, lk: int) -> None:
        """Raise ``ValueError`` for lengths the encoding does not cover."""
        if self.needs_max_len and self.max_len is not None and max(lq, lk) > self.max_len:
            raise ValueError(
                f"sequence length {max(lq, lk)} exceeds max_len={self.max_len} of the "
                f"relative positional encoding"
            )

    # ---------------------------------------------------------------------------- attention
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
        """Kernelized attention weighted by these positions (shapes as in
        :func:`kattn.functional.linear_attention`), by ``self.method``.

        ``positive_features`` says every weight is >= 0, so each output is a convex combination
        of values: the FFT path then clamps its outputs to the values' range (round-off can
        leave a near-zero normaliser for rows whose weights are all tiny)."""
        lq, lk = phi_q.shape[2], phi_k.shape[2]
        self.check_lengths(lq, lk)
        common: dict[str, Any] = {
            "causal": causal,
            "k_log_scale": k_log_scale,
            "key_padding_mask": key_padding_mask,
            "eps": eps,
        }
        method = self.method
        if phi_q.shape[0] == 0:
            # nothing to compute; the dense form gives the empty output (and gradients) while
            # the fast paths size their blocks by rows and assume at least one
            method = "dense"
        if method == "auto":
            method = self._auto_method(phi_q, phi_k, v, causal)
        if method == "dense":
            return self._attend_dense(phi_q, phi_k, v, **common)
        if method == "fft":
            return self._attend_fft(phi_q, phi_k, v, convex=positive_features, **common)
        return self._attend_fast(phi_q, phi_k, v, chunk_size=chunk_size, block_size=block_size,
                                 **common)  # fmt: skip

    def fft_points(self, lq: int, lk: int) -> int:
        """Points of the FFT of one channel (for the ``"auto"`` choice)."""
        return fft_length(lq + lk - 1)

    def _auto_method(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, causal: bool) -> str:
        """``"dense"`` (the blocked exact form) or ``"fft"``, whichever should be faster: on
        the CPU by a cost model of both (the FFT wins only for long sequences with few
        features), elsewhere the dense form up to a number of kernel entries (see
        :func:`~kattn.functional.rpe_blocked.prefer_blocked`)."""
        b, h, lq, m = phi_q.shape
        lk, dv = phi_k.shape[2], v.shape[-1]
        points = self.fft_points(lq, lk)
        dense = prefer_blocked(b * h, lq, lk, m, dv, points, causal=causal, device=phi_q.device)
        return "dense" if dense else "fft"

    def _attend_dense(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        *,
        causal: bool,
        k_log_scale: Tensor | None,
        key_padding_mask: Tensor | None,
        eps: float,
    ) -> Tensor:
        """The exact O(Lq·Lk) form, in blocks of queries: ``log c + s_j`` shifted by its
        maximum over each query's visible keys (so no future key sets a causal query's scale)."""
        lq, lk = phi_q.shape[2], phi_k.shape[2]
        return rpe_linear_attention_blocked(
            phi_q,
            phi_k,
            v,
            self.row_log_coefficients(lq, lk),
            causal=causal,
            k_log_scale=k_log_scale,
            key_padding_mask=key_padding_mask,
            eps=eps,
        )

    def _attend_fft(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        """The FFT path over :meth:`log_coefficients` (1-D encodings)."""
        lq, lk = phi_q.shape[2], phi_k.shape[2]
        return rpe_linear_attention_fft(phi_q, phi_k, v, self.log_coefficients(lq, lk), **kwargs)

    def _attend_fast(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, method={self.method!r}"


class WindowDecoding:
    """Mixin: decoding with a :class:`~kattn.functional.BandedState` (a window of
    recent tokens and one linear-attention state); the class gives the window's
    log-coefficients by :meth:`decoding_window`."""

    num_heads: int

    def decoding_window(self, state: BandedState) -> tuple[Tensor, int]:
        """``(log_coeff (H, left + 2), left)`` of the offsets ``−left…1`` for the next step
        (raise ``ValueError`` for a position the encoding does not cover)."""
        raise NotImplementedError

    def init_state(
        self, batch_size: int, num_features: int, *, device: Any, dtype: torch.dtype
    ) -> BandedState:
        return banded_init_state(
            batch_size, self.num_heads, num_features, device=device, dtype=dtype
        )

    def step(
        self,
        phi_q: Tensor,
        phi_k: Tensor,
        v: Tensor,
        state: BandedState,
        *,
        k_log_scale: Tensor | None = None,
        eps: float = DEFAULT_EPS,
    ) -> tuple[Tensor, BandedState]:
        check_window_state(state, phi_k, v)
        log_coeff, left = self.decoding_window(state)
        return banded_step(
            phi_q, phi_k, v, state, log_coeff, left, k_log_scale=k_log_scale, eps=eps
        )


def check_window_state(state: object, phi_k: Tensor, v: Tensor) -> None:
    """Raise ``ValueError`` unless ``state`` is a :class:`BandedState` for keys ``phi_k``
    ``(B, H, 1, M)`` and values ``v`` ``(B, H, 1, Dv)`` (same B, H, M; Dv or empty)."""
    if not isinstance(state, BandedState):
        raise ValueError(
            f"state must be a BandedState (from init_state), got {type(state).__name__}"
        )
    b, h, _, m = phi_k.shape
    dv = v.shape[-1]
    window, far = state.keys.shape, state.far.kv.shape
    if (window[0], window[1], window[3]) != (b, h, m) or tuple(far[:3]) != (b, h, m):
        raise ValueError(
            f"state was made for keys (B, H, ·, M) = ({window[0]}, {window[1]}, ·, "
            f"{window[3]}), got a step with B={b}, H={h}, M={m}: start from "
            "init_state(batch_size, num_heads) with this step's batch size"
        )
    if state.values.shape[-1] not in (0, dv) or far[3] not in (0, dv):
        raise ValueError(f"state holds values of dim {state.values.shape[-1]}, got v with Dv={dv}")
