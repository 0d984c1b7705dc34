"""Which relative positional encodings the Triton kernels cover, and their ``attend`` by them:
the hook through which the ``backend`` option (:mod:`kattn.ops.triton.dispatch`) can send an
encoding's forward to :mod:`~kattn.ops.triton.decay`, :mod:`~kattn.ops.triton.banded` or
:mod:`~kattn.ops.triton.toeplitz_blocked`.

Covered: :class:`~kattn.positional.DecayBias` with its ``"recurrent"`` method,
:class:`~kattn.positional.BucketedBias` with ``"banded"`` and the 1-D
:class:`~kattn.positional.ToeplitzBias` with ``"dense"`` or ``"auto"`` (the exact blocked
form; the FFT has no kernel). Decoding steps stay on the PyTorch path. This module imports
triton only when a kernel runs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...aggregator import Aggregator
from ...positional.bucketed import BucketedBias
from ...positional.decay import DecayBias
from ...positional.toeplitz import ToeplitzBias

__all__ = ["KERNEL_METHODS", "rpe_attend_triton", "rpe_kernel_gap"]

#: encoding class → the methods whose forward a kernel computes.
KERNEL_METHODS: dict[type, tuple[str, ...]] = {
    DecayBias: ("recurrent",),
    BucketedBias: ("banded",),
    ToeplitzBias: ("dense", "auto"),
}
#: the chunk (or block) sizes the kernels take; others run with :data:`FALLBACK_CHUNK`.
KERNEL_CHUNKS = (16, 32, 64, 128)
FALLBACK_CHUNK = 32


def rpe_kernel_gap(aggregator: Aggregator) -> str | None:
    """Why no Triton kernel computes ``aggregator.attend`` (None when one does)."""
    methods = KERNEL_METHODS.get(type(aggregator))
    if methods is None:
        return f"{type(aggregator).__name__} has no Triton kernel"
    method = getattr(aggregator, "method", None)
    if method not in methods:
        return (
            f"{type(aggregator).__name__}'s Triton kernel computes method "
            f"{' or '.join(map(repr, methods))}, this module has {method!r}"
        )
    return None


def rpe_attend_triton(
    aggregator: Aggregator,
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = FALLBACK_CHUNK,
    eps: float,
    **path_options: Any,
) -> Tensor:
    """``aggregator.attend(...)`` by its Triton kernel (the same result; gradients, of the
    encoding's parameters too, by the kernels' own backward where it fits, else by the
    PyTorch path recomputed).

    ``chunk_size`` sets the kernels' chunks when it is one of :data:`KERNEL_CHUNKS` (the
    result does not depend on it); ``path_options`` (``block_size``, ``positive_features``)
    tune the PyTorch paths only (the FFT's clamp, a memory bound) and change nothing here.

    Raises:
        NotImplementedError: an encoding or method without a kernel (:func:`rpe_kernel_gap`).
    """
    gap = rpe_kernel_gap(aggregator)
    if gap is not None:
        raise NotImplementedError(gap)
    lq, lk = phi_q.shape[2], phi_k.shape[2]
    aggregator.check_lengths(lq, lk)
    chunk = chunk_size if chunk_size in KERNEL_CHUNKS else FALLBACK_CHUNK
    common: dict[str, Any] = dict(
        causal=causal, k_log_scale=k_log_scale, key_padding_mask=key_padding_mask, eps=eps
    )
    if isinstance(aggregator, DecayBias):
        from .decay import decay_linear_attention_triton

        log_alpha, log_gamma = aggregator.log_alpha, aggregator.log_gamma()
        return decay_linear_attention_triton(
            phi_q, phi_k, v, log_alpha, log_gamma, chunk_size=chunk, **common
        )
    if isinstance(aggregator, BucketedBias):
        from .banded import banded_linear_attention_triton

        log_coeff = aggregator.band_log_coefficients()
        return banded_linear_attention_triton(
            phi_q, phi_k, v, log_coeff, aggregator.left, chunk_size=chunk, **common
        )
    from .toeplitz_blocked import toeplitz_linear_attention_triton

    assert isinstance(aggregator, ToeplitzBias)
    log_coeff = aggregator.log_coefficients(lq, lk)
    return toeplitz_linear_attention_triton(phi_q, phi_k, v, log_coeff, block_size=chunk, **common)
