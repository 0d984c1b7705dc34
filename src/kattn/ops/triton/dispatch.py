"""Which implementation the sums of kernelized attention run: the ``backend`` option.

* ``"torch"`` — the PyTorch paths of :mod:`kattn.functional` (every device, every case).
* ``"triton"`` — the Triton kernels of this package: for the plain linear aggregator, causal
  and non-causal forward and backward, key padding, key log-scales, the decoding step and a
  prefill without a graph; for the relative positional encodings that have kernels
  (:mod:`~kattn.ops.triton.rpe_dispatch`: ``DecayBias`` ``"recurrent"``, ``BucketedBias``
  ``"banded"``, the 1-D ``ToeplitzBias`` ``"dense"``/``"auto"``), ``attend`` (their decoding
  stays on PyTorch). A call they do not cover raises ``NotImplementedError`` saying why, an
  encoding without a kernel already at construction; CUDA tensors, or CPU tensors in
  Triton's interpreter (``TRITON_INTERPRET=1``).
* ``"auto"`` (the default) — the kernels when they cover the call, the tensors are on CUDA
  in fp32/fp16/bf16, triton imports and the state is within the checked sizes
  (:func:`kernels_fit`), except where an encoding of method ``"auto"`` would choose its FFT;
  else the PyTorch path. On the CPU nothing changes. :func:`use_triton` alone decides.

This module imports triton only when a kernel is chosen, so ``kattn`` works without it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ...aggregator import Aggregator, LinearAggregator
from ...functional.linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE, LinearState
from ...functional.numerics import DEFAULT_EPS
from ...positional.base import RelativePositionBias
from .placement import check_device, triton_importable
from .rpe_dispatch import KERNEL_CHUNKS, rpe_attend_triton, rpe_kernel_gap
from .sizes import (
    MAX_FP64_FEATURES,
    MAX_FP64_VALUES,
    checked_sizes,
)

__all__ = [
    "BACKENDS",
    "TritonEncodingAggregator",
    "TritonLinearAggregator",
    "check_backend",
    "kernel_gap",
    "refuse_uncovered",
    "select_aggregator",
    "use_triton",
]

#: the values of the ``backend`` option.
BACKENDS = ("auto", "triton", "torch")


def check_backend(backend: object) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else ``ValueError``."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    return backend


def kernel_gap(
    aggregator: Aggregator,
    *,
    call: str,
    causal: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tensors: Iterable[object] = (),
    features: tuple[Tensor, Tensor, Tensor] | None = None,
) -> str | None:
    """Why the Triton kernels do not cover this call (None when they do).

    Args:
        aggregator: the mechanism's aggregator: the plain linear one, or an encoding (whose
            ``attend`` alone has kernels, :func:`~.rpe_dispatch.rpe_kernel_gap`).
        call: ``"attend"``, ``"step"`` or ``"prefill"``.
        causal: for ``"attend"``, whether the call is causal (the chunked kernels).
        chunk_size: the mechanism's chunk size, which the causal kernels use.
        tensors: the inputs and state of a step or prefill (their kernels have no backward):
            tensors, None, or tuples of them such as a state.
        features: the ``(phi_q, phi_k, v)`` of an ``attend`` or ``prefill``: fp64 ones
            beyond the sizes checked in fp64 (:func:`checked_sizes`) are not covered.
    """
    if type(aggregator) is not LinearAggregator:
        gap = _encoding_gap(aggregator, call)
    else:
        gap = _linear_gap(call, causal, chunk_size, tensors)
    return gap if gap is not None or features is None else _fp64_gap(features[0], features[2])


def _linear_gap(call: str, causal: bool, chunk_size: int, tensors: Iterable[object]) -> str | None:
    """Why no kernel of the plain linear aggregator runs this call (None when one does)."""
    uses_chunks = call == "prefill" or (call == "attend" and causal)
    if uses_chunks and chunk_size not in KERNEL_CHUNKS:
        return (
            f"the causal kernels take chunk_size in {KERNEL_CHUNKS}, this module has {chunk_size}"
        )
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in _flat(tensors))
    if call != "attend" and needs_grad:
        return (
            f"the Triton {call} has no backward and a gradient is needed: run it under "
            "torch.no_grad()"
        )
    return None


def _encoding_gap(aggregator: Aggregator, call: str) -> str | None:
    """Why no kernel runs this call of a relative positional encoding (None when one does)."""
    if call != "attend":
        return (
            f"the {call} of {type(aggregator).__name__} (relative positional weights) runs on "
            "the PyTorch path: its Triton kernel computes attend only"
        )
    return rpe_kernel_gap(aggregator)


def _flat(items: Iterable[object]) -> list[Tensor]:
    """The tensors among ``items``, tuples (a state) opened."""
    found: list[Tensor] = []
    for x in items:
        if isinstance(x, Tensor):
            found.append(x)
        elif isinstance(x, tuple):
            found.extend(_flat(x))
    return found


def use_triton(
    backend: str,
    gap: str | None,
    x: Tensor,
    *,
    aggregator: Aggregator | None = None,
    features: tuple[Tensor, Tensor, Tensor] | None = None,
    causal: bool = True,
) -> bool:
    """Whether ``backend`` runs the kernels on inputs like ``x``, given :func:`kernel_gap`.

    Under ``"auto"`` they run when they cover the call, ``x`` is a CUDA tensor other than
    fp64 and triton imports; given the ``features`` ``(phi_q, phi_k, v)`` of an ``attend`` or
    ``prefill`` of ``aggregator`` (``causal`` or not), also when the state fits
    (:func:`kernels_fit`) and ``aggregator`` is no encoding of method ``"auto"`` that would
    choose its FFT (long sequences: O(L log L) against the kernel's exact O(L²)).

    Raises:
        NotImplementedError: ``backend="triton"`` and the kernels do not cover the call.
        ImportError: ``backend="triton"`` without triton installed.
        ValueError: ``backend="triton"`` on tensors the kernels cannot read
            (:func:`~.placement.check_device`).
    """
    if backend == "torch":
        return False
    if backend == "auto":
        fits = x.device.type == "cuda" and x.dtype != torch.float64
        if gap is not None or not fits or not triton_importable():
            return False
        return features is None or not _auto_keeps_pytorch(aggregator, *features, causal=causal)
    if gap is not None:
        raise NotImplementedError(
            f"backend='triton' does not cover this call: {gap}. Use backend='auto' to fall back "
            "on the PyTorch path"
        )
    if not triton_importable():
        raise ImportError(
            "backend='triton' needs triton: pip install 'kattn[gpu]' (Linux), or use backend='auto'"
        )
    check_device(x)
    return True


def _auto_keeps_pytorch(
    aggregator: Aggregator | None, phi_q: Tensor, phi_k: Tensor, v: Tensor, *, causal: bool
) -> bool:
    """Whether ``"auto"`` keeps covered sums on the PyTorch path: a state beyond the checked
    sizes, or an encoding of method ``"auto"`` whose own choice for the call is the FFT."""
    if not kernels_fit(phi_q, v):
        return True
    return (
        isinstance(aggregator, RelativePositionBias)
        and aggregator.method == "auto"
        and aggregator._auto_method(phi_q, phi_k, v, causal) == "fft"
    )


def refuse_uncovered(backend: str, aggregator: Aggregator) -> None:
    """``NotImplementedError`` at construction when ``backend="triton"`` is asked of an
    aggregator whose ``attend`` has no kernel (an encoding or method without one), so no call
    could run."""
    gap = kernel_gap(aggregator, call="attend", causal=False)
    if backend == "triton" and gap is not None:
        raise NotImplementedError(
            f"backend='triton' does not cover this attention: {gap}. Use backend='auto' to "
            "fall back on the PyTorch path"
        )


def select_aggregator(
    backend: str,
    aggregator: Aggregator,
    x: Tensor,
    *,
    call: str,
    causal: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tensors: Iterable[object] = (),
    features: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Aggregator:
    """The aggregator that ``backend`` runs for this call on inputs like ``x``: a
    :class:`TritonLinearAggregator`, a :class:`TritonEncodingAggregator` or ``aggregator``
    itself (arguments as :func:`kernel_gap`; ``features``, the ``(phi_q, phi_k, v)`` of an
    ``attend`` or ``prefill``, for ``"auto"``'s choice; errors as :func:`use_triton`)."""
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return aggregator
    gap = kernel_gap(
        aggregator, call=call, causal=causal, chunk_size=chunk_size, tensors=tensors,
        features=features,
    )  # fmt: skip
    if not use_triton(backend, gap, x, aggregator=aggregator, features=features, causal=causal):
        return aggregator
    if type(aggregator) is not LinearAggregator:
        return triton_encoding_aggregator(aggregator)
    return triton_linear_aggregator(aggregator.num_heads)


@functools.cache
def triton_linear_aggregator(num_heads: int) -> TritonLinearAggregator:
    """The :class:`TritonLinearAggregator` of ``num_heads`` heads, made once (it holds no
    tensors), not at every decoding step."""
    return TritonLinearAggregator(num_heads=num_heads)


#: encoding → its :class:`TritonEncodingAggregator`; an entry goes with its encoding.
_ENCODING_AGGREGATORS: weakref.WeakKeyDictionary[Aggregator, TritonEncodingAggregator] = (
    weakref.WeakKeyDictionary()
)


def triton_encoding_aggregator(encoding: Aggregator) -> TritonEncodingAggregator:
    """The :class:`TritonEncodingAggregator` of ``encoding``, made once per encoding, not at
    every call."""
    found = _ENCODING_AGGREGATORS.get(encoding)
    if found is None:
        found = _ENCODING_AGGREGATORS[encoding] = TritonEncodingAggregator(encoding)
    return found


def kernels_fit(phi_q: Tensor, v: Tensor) -> bool:
    """Whether features ``(…, M)`` and values ``(…, Dv)`` are within the checked sizes of
    ``v``'s dtype (:func:`checked_sizes`)."""
    max_features, max_values = checked_sizes(v.dtype)
    return phi_q.shape[-1] <= max_features and v.shape[-1] <= max_values


def _fp64_gap(phi_q: Tensor, v: Tensor) -> str | None:
    """Why fp64 sums of this size do not run on the kernels (None when they may): a launch
    would need more shared memory than a GPU has."""
    if v.dtype != torch.float64 or kernels_fit(phi_q, v):
        return None
    return (
        f"fp64 kernels are checked to fit a GPU's shared memory up to M <= {MAX_FP64_FEATURES} "
        f"features and Dv <= {MAX_FP64_VALUES} value columns (an fp64 tile takes twice the "
        f"bytes), this call has M = {phi_q.shape[-1]} and Dv = {v.shape[-1]}: use fp32 or half "
        "inputs, or backend='torch' for fp64"
    )


class TritonEncodingAggregator(Aggregator):
    """A relative positional encoding's ``attend`` by its Triton kernel
    (:func:`~kattn.ops.triton.rpe_dispatch.rpe_attend_triton`): the same result, gradients
    reaching the encoding's own parameters. It refers to the encoding without owning it or
    keeping it alive (no parameters, no state_dict of its own; a weak reference, so that
    :func:`triton_encoding_aggregator`'s cache lets the encoding go)."""

    supports_recurrent = False

    def __init__(self, encoding: Aggregator) -> None:
        super().__init__()
        self._encoding = weakref.ref(encoding)  # not a child module: the mechanism owns it

    @property
    def encoding(self) -> Aggregator:
        """The encoding whose ``attend`` the kernel computes."""
        encoding = self._encoding()
        if encoding is None:
            raise RuntimeError("the encoding of this TritonEncodingAggregator no longer exists")
        return encoding

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
        """:func:`~kattn.ops.triton.rpe_dispatch.rpe_attend_triton` of the encoding
        (``block_size`` and ``positive_features`` tune the PyTorch paths only)."""
        return rpe_attend_triton(
            self.encoding, phi_q, phi_k, v, causal=causal, k_log_scale=k_log_scale,
            key_padding_mask=key_padding_mask, chunk_size=chunk_size, eps=eps,
        )  # fmt: skip


class TritonLinearAggregator(LinearAggregator):
    """:class:`~kattn.aggregator.LinearAggregator` by the Triton kernels: the same results,
    the same state; ``block_size`` (a memory knob of the PyTorch path) does not apply."""

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
        """:func:`~kattn.ops.triton.causal_linear.causal_linear_attention_triton` if
        ``causal``, else :func:`~kattn.ops.triton.noncausal_linear.linear_attention_triton`."""
        options: dict[str, Any] = dict(
            k_log_scale=k_log_scale, key_padding_mask=key_padding_mask, eps=eps
        )
        if causal:
            from .causal_linear import causal_linear_attention_triton

            return causal_linear_attention_triton(phi_q, phi_k, v, chunk_size=chunk_size, **options)
        from .noncausal_linear import linear_attention_triton

        return linear_attention_triton(phi_q, phi_k, v, **options)

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
        """:func:`~kattn.ops.triton.linear_step.linear_step_triton`."""
        from .linear_step import linear_step_triton

        return linear_step_triton(phi_q, phi_k, v, state, k_log_scale=k_log_scale, eps=eps)

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
        """:func:`~kattn.ops.triton.causal_linear.causal_linear_prefill_triton`."""
        from .causal_linear import causal_linear_prefill_triton

        return causal_linear_prefill_triton(
            phi_q, phi_k, v, state, k_log_scale=k_log_scale, eps=eps, chunk_size=chunk_size,
            **kwargs,
        )  # fmt: skip
