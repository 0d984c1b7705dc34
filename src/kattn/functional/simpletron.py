"""SimpleTRON attention: ``Z = Q (Kᵀ V) / √n``, no feature map, no normaliser.

Yorsh, The Study of Linear Self-Attention Mechanism in Transformer (bachelor's thesis, CTU
Prague 2022), §4.2: linear attention with φ = identity whose row normaliser
``φ(q_i)·Σ_j φ(k_j)`` is replaced by a constant.

* non-causal: ``z_i = q_i·Σ_j k_j v_jᵀ / √n`` with n the non-padded keys of the batch element,
  at least 1 (the thesis's ``1/√L`` when nothing is padded; a fully padded row gives zeros),
  O(L·D·Dv);
* causal (the thesis's "MaskedSimpleAtt"): ``z_i = q_i·S_i``, ``S_i = S_{i−1} + k_i v_iᵀ``,
  ``S_0 = 0``, with no scale at all (``causal_scale="none"``, the default).

``causal_scale="sqrt_prefix_count"`` divides query i by ``√n_i`` instead, n_i the non-padded
keys at positions ``j <= i`` (at least 1): a kattn variant, not in the thesis, that keeps the
output's magnitude from growing like ``√i`` along the sequence, the causal counterpart of the
non-causal ``1/√n`` (which no causal form can use: it depends on the final length). Under
either option position i depends on nothing after it and the causal forward equals the
recurrent steps.

Paths (each equal to :func:`simpletron_attention_reference`): :func:`simpletron_attention`
(non-causal by ``Kᵀ V``, causal by the chunkwise-parallel sums of
:func:`~kattn.functional.linear_causal.causal_linear_sums`), :func:`simpletron_prefill` and
:func:`simpletron_step`. Sums are accumulated in fp32 (fp64 stays fp64), padded keys and values
are zeroed, and the output has the dtype of ``v``. Counts are computed by tensor operations
(never from Python numbers), so a ``torch.jit.trace`` of the non-causal form holds at any length.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    LinearState,
    causal_linear_sums,
    linear_attention_init_state,
)
from .linear_step import causal_step_sums
from .masks import allowed_keys
from .numerics import accumulation_dtype, prepare_linear_inputs

#: values of ``causal_scale``: the thesis's unscaled ``q_i·S_i`` and the prefix-count variant.
CAUSAL_SCALES = ("none", "sqrt_prefix_count")


class SimpletronState(NamedTuple):
    """Recurrent state of causal SimpleTRON after t tokens, constant in size.

    Attributes:
        sums: the :class:`~kattn.functional.linear_causal.LinearState` of causal linear
            attention with φ = identity; ``sums.kv (B, H, D, Dv)`` is ``S_t = Σ_{j<=t} k_j v_jᵀ``.
        num_keys: ``(B,)``, n, the number of non-padded keys so far (kept under either
            ``causal_scale``, so a state does not depend on the option).
    """

    sums: LinearState
    num_keys: Tensor


def check_causal_scale(causal_scale: object) -> str:
    """``causal_scale`` if it is one of :data:`CAUSAL_SCALES`, else a ``ValueError``."""
    if not isinstance(causal_scale, str) or causal_scale not in CAUSAL_SCALES:
        raise ValueError(
            f"causal_scale must be one of {', '.join(map(repr, CAUSAL_SCALES))}, "
            f"got {causal_scale!r}"
        )
    return causal_scale


def simpletron_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    causal_scale: str = "none",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    """``Q (Kᵀ V) / √n`` non-causally in O(L·D·Dv); causally ``z_i = q_i·S_i`` in
    chunkwise-parallel form.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)`` (causal: Lq == Lk).
        causal: query i sees keys ``j <= i``.
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that must not count (in the sums
            and in n).
        causal_scale: ``"none"`` (the thesis: ``q_i·S_i``) or ``"sqrt_prefix_count"``
            (``q_i·S_i / √n_i``, n_i the non-padded keys at ``j <= i``); causal only.
        chunk_size: tokens per chunk of the causal form.
        block_size: tokens per block of chunks computed together (causal form).

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    check_causal_scale(causal_scale)
    if causal:
        out, _ = simpletron_prefill(
            q,
            k,
            v,
            key_padding_mask=key_padding_mask,
            causal_scale=causal_scale,
            chunk_size=chunk_size,
            block_size=block_size,
        )
        return out
    fq, fk, v32, _ = prepare_linear_inputs(q, k, v, None, key_padding_mask)
    kv = fk.transpose(-1, -2) @ v32  # (B, H, D, Dv)
    count = _kept_keys(key_padding_mask, fk).sum(dim=1).clamp_min(1.0)  # (B,)
    return (fq @ kv / count.sqrt()[:, None, None, None]).to(v.dtype)


def simpletron_prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: SimpletronState | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    causal_scale: str = "none",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[Tensor, SimpletronState]:
    """Causal SimpleTRON over L tokens that follow ``state`` (fresh if None).

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)``.
        state: the state after the tokens before these ones.
        key_padding_mask: ``(B, L)`` bool, True marks keys that must not count.
        causal_scale, chunk_size, block_size: see :func:`simpletron_attention`.

    Returns:
        The output ``(B, H, L, Dv)`` in the dtype of ``v`` and the state after the L tokens.
    """
    check_causal_scale(causal_scale)
    fq, fk, v32, _ = prepare_linear_inputs(q, k, v, None, key_padding_mask)
    sums: LinearState | None = None
    before = fq.new_zeros(fk.shape[0])
    if state is not None:
        sums, before = _checked(state, fk.shape[0])
    num, _, _, final = causal_linear_sums(
        fq, fk, v32, None, sums, chunk_size=chunk_size, block_size=block_size
    )
    seen = _kept_keys(key_padding_mask, fk).cumsum(dim=1)  # (B, L), keys seen by each query
    seen = seen + before.to(fq.dtype)[:, None]
    if causal_scale == "sqrt_prefix_count":
        num = num / seen.clamp_min(1.0).sqrt()[:, None, :, None]
    return num.to(v.dtype), SimpletronState(final, seen[:, -1])


def simpletron_init_state(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> SimpletronState:
    """The state before any token (sums in the accumulation dtype of ``dtype``).

    The value dim is not known yet: the first step sets it.
    """
    sums = linear_attention_init_state(
        batch_size, num_heads, head_dim, 0, device=device, dtype=dtype
    )
    return SimpletronState(sums, sums.k_sum.new_zeros(batch_size))


def simpletron_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, state: SimpletronState, *, causal_scale: str = "none"
) -> tuple[Tensor, SimpletronState]:
    """One causal step, ``z_t = q_t·S_t`` (over ``√n_t`` with ``"sqrt_prefix_count"``):
    O(D·Dv) time and memory at any position.

    Args:
        q_t, k_t: ``(B, H, 1, D)``; v_t: ``(B, H, 1, Dv)``.
        state: the state after the previous tokens.
        causal_scale: see :func:`simpletron_attention`.

    Returns:
        The output ``(B, H, 1, Dv)`` and the state including this token.
    """
    check_causal_scale(causal_scale)
    fq, fk, v32, _ = prepare_linear_inputs(q_t, k_t, v_t, None, None)
    sums, before = _checked(state, fk.shape[0])
    num, _, sums = causal_step_sums(fq, fk, v32, None, sums)
    count = before.to(fq.dtype) + 1.0
    if causal_scale == "sqrt_prefix_count":
        num = num / count.sqrt()[:, None, None, None]
    return num.to(v_t.dtype), SimpletronState(sums, count)


def simpletron_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    causal_scale: str = "none",
) -> Tensor:
    """Slow, explicit SimpleTRON: the masked ``(Lq, Lk)`` matrix ``Q Kᵀ``, times V, scaled.

    Non-causal rows are divided by √n, n the keys they may see (at least 1); causal rows as
    ``causal_scale`` says. Shapes as :func:`simpletron_attention`.
    """
    check_causal_scale(causal_scale)
    acc = accumulation_dtype(v.dtype)
    scores = q.to(acc) @ k.to(acc).transpose(-1, -2)  # (B, H, Lq, Lk)
    allowed = allowed_keys(
        q.shape[2], k.shape[2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
    )
    if allowed is None:
        allowed = torch.ones_like(scores[:1, :1, :1], dtype=torch.bool)  # (1, 1, 1, Lk)
    scores = scores.masked_fill(~allowed, 0.0)
    out = scores @ v.to(acc)
    if not causal or causal_scale == "sqrt_prefix_count":
        count = allowed.to(acc).sum(dim=-1, keepdim=True).clamp_min(1.0)  # (·, ·, Lq or 1, 1)
        out = out / count.sqrt()
    return out.to(v.dtype)


def _kept_keys(key_padding_mask: Tensor | None, fk: Tensor) -> Tensor:
    """``(B, Lk)``: 1 for keys that count, 0 for padding, in the dtype of ``fk``; made from
    tensors, not from the length as a number, so that a trace follows the length."""
    if key_padding_mask is None:
        return torch.ones_like(fk[:, 0, :, 0])
    return (~key_padding_mask).to(fk.dtype)


def _checked(state: SimpletronState, b: int) -> tuple[LinearState, Tensor]:
    if not isinstance(state, SimpletronState):
        raise ValueError(
            f"state must be a SimpletronState (from init_state), got {type(state).__name__}"
        )
    if tuple(state.num_keys.shape) != (b,):
        raise ValueError(
            f"state.num_keys has shape {tuple(state.num_keys.shape)}, expected (B,) = ({b},)"
        )
    return state.sums, state.num_keys
