"""Linear (kernelized) attention, ``z_i = φ(q_i)·Σ_j φ(k_j) v_jᵀ / φ(q_i)·Σ_j φ(k_j)``.

Katharopoulos et al. 2020 ("Transformers are RNNs"); the normalised form of Luo et al. 2021 eq. (3).

Features come in log-space friendly form: the key features are ``phi_k · exp(k_log_scale)``
with ``phi_k`` bounded and ``k_log_scale`` a per-key scalar ``(B, H, Lk)`` that may be large
(e.g. ``max_m w_m·k − ‖k‖²/2`` for positive random features). Any positive per-query factor
cancels in the ratio, so queries pass only their bounded part. Key scales are shifted by an
offset that cancels in the ratio (and never looks at a future key in causal mode). Sums are
accumulated in fp32 (fp64 stays fp64) and the output has the dtype of ``v``.

Paths (each equal to :func:`linear_attention_reference`):

* :func:`linear_attention_parallel` — non-causal, O(L·M·Dv).
* :func:`~kattn.functional.linear_causal.linear_attention_chunked` — causal, chunkwise parallel.
* :func:`~kattn.functional.linear_step.linear_attention_step` — one recurrent step.
* :func:`linear_attention_cumsum` — the textbook causal prefix sum, which materialises an
  ``(L, M, Dv)`` tensor; kept as a second reference and as a benchmark baseline.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .linear_causal import DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE, linear_attention_chunked
from .masks import allowed_keys
from .numerics import (
    DEFAULT_EPS,
    accumulation_dtype,
    guard_normaliser,
    prepare_linear_inputs,
    scaled_key_features,
)


def linear_attention_parallel(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Non-causal linear attention in O(L·M·Dv).

    Args:
        phi_q: ``(B, H, Lq, M)`` query features (any positive per-query factor cancels).
        phi_k: ``(B, H, Lk, M)`` key features, scaled by ``exp(k_log_scale)`` if given.
        v: ``(B, H, Lk, Dv)``.
        k_log_scale: ``(B, H, Lk)`` or None.
        key_padding_mask: ``(B, Lk)`` bool, True marks keys that must not count.
        eps: guard of the normaliser.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of ``v``.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    fk = scaled_key_features(fk, s)
    kv = fk.transpose(-1, -2) @ v32  # (B, H, M, Dv)
    num = fq @ kv  # (B, H, Lq, Dv)
    den = fq @ fk.sum(dim=2)[..., None]  # (B, H, Lq, 1)
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def linear_attention(
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
) -> Tensor:
    """Linear attention: the chunked form if ``causal``, else the parallel form."""
    if causal:
        return linear_attention_chunked(
            phi_q,
            phi_k,
            v,
            k_log_scale=k_log_scale,
            key_padding_mask=key_padding_mask,
            chunk_size=chunk_size,
            block_size=block_size,
            eps=eps,
        )
    return linear_attention_parallel(
        phi_q, phi_k, v, k_log_scale=k_log_scale, key_padding_mask=key_padding_mask, eps=eps
    )


def linear_attention_cumsum(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Causal linear attention by a prefix sum over ``(L, M, Dv)`` outer products.

    The formulation of several earlier libraries: memory O(L·M·Dv). Plain features only (no
    log-scales), so use it with inputs whose features do not overflow.
    """
    fq, fk, v32, _ = prepare_linear_inputs(phi_q, phi_k, v, None, key_padding_mask)
    kv = torch.einsum("bhlm,bhld->bhlmd", fk, v32).cumsum(dim=2)  # (B, H, L, M, Dv)
    num = torch.einsum("bhlm,bhlmd->bhld", fq, kv)
    den = torch.einsum("bhlm,bhlm->bhl", fq, fk.cumsum(dim=2))[..., None]
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def linear_attention_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    coeff: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Slow, explicit linear attention: the ``(Lq, Lk)`` kernel matrix, masked, normalised.

    Takes the plain features (``phi_k`` already includes any scale). ``coeff``, broadcastable
    to ``(B, H, Lq, Lk)``, multiplies the kernel entry-wise: the dense positional weights
    ``C = [c_{j−i}]`` of relative positional encodings (``(C ⊙ φ(Q)φ(K)ᵀ) V``, normalised).
    """
    acc = accumulation_dtype(v.dtype)
    kernel = torch.einsum("bhim,bhjm->bhij", phi_q.to(acc), phi_k.to(acc))  # (B, H, Lq, Lk)
    if coeff is not None:
        kernel = kernel * coeff.to(acc)
    allowed = allowed_keys(
        phi_q.shape[2],
        phi_k.shape[2],
        causal=causal,
        key_padding_mask=key_padding_mask,
        device=phi_q.device,
    )
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    num = kernel @ v.to(acc)
    den = kernel.sum(dim=-1, keepdim=True)
    return (num / guard_normaliser(den, eps)).to(v.dtype)
