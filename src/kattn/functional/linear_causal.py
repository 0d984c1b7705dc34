"""Causal linear attention: chunkwise-parallel prefill and the recurrent step.

Query i sees keys j <= i: ``z_i = φ(q_i)·S_i / φ(q_i)·z_i`` with ``S_i = Σ_{j<=i} φ(k_j) v_jᵀ``.

* :func:`linear_attention_chunked` — the sequence is cut into chunks of C tokens; inside a
  chunk the masked C×C products are computed directly, across chunks a prefix state carries
  ``Σ φ(k) vᵀ``. Nothing of size ``(L, M, Dv)`` is formed: O(L·C·(M+Dv) + L·M·Dv) time,
  O(L·(M+Dv)) memory. Chunks are processed in blocks of about ``block_size`` tokens that
  hand the state on, so temporaries stay small and cache-resident.
* :func:`linear_attention_prefill` — the same from a given :class:`LinearState`, returning
  the state after the last token (prompt processing before decoding).
* :func:`~kattn.functional.linear_step.linear_attention_step` — one token, O(M·Dv) whatever
  the position.

With key log-scales ``s_j`` (see :mod:`kattn.functional.linear`) every query i uses the
running maximum ``r_i = max_{j<=i} s_j`` as its key offset, and states are rescaled between
running maxima, so no offset depends on a future token: with finite inputs, changing future
tokens leaves earlier outputs bitwise unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .numerics import (
    DEFAULT_EPS,
    accumulation_dtype,
    exp_floor,
    exp_nonpositive,
    exp_nonpositive_,
    guard_normaliser,
    log_floor,
    prepare_linear_inputs,
)

#: default number of tokens per chunk.
DEFAULT_CHUNK_SIZE = 64
#: default number of tokens per block of chunks that are processed together.
DEFAULT_BLOCK_SIZE = 4096


class LinearState(NamedTuple):
    """Recurrent state of causal linear attention after t tokens.

    Attributes:
        kv: ``(B, H, M, Dv)``, ``Σ_j exp(s_j − offset) φ̃(k_j) v_jᵀ``.
        k_sum: ``(B, H, M)``, ``Σ_j exp(s_j − offset) φ̃(k_j)`` (the normaliser).
        offset: ``(B, H)``, the running maximum of the key log-scales ``s_j``.

    Steps without a graph update ``kv`` and ``k_sum`` in place (decoding is bound by passes
    over them): continue from the latest state only; to branch, clone its tensors first.
    """

    kv: Tensor
    k_sum: Tensor
    offset: Tensor


def linear_attention_init_state(
    batch_size: int,
    num_heads: int,
    num_features: int,
    value_dim: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> LinearState:
    """The state before any token (sums in the accumulation dtype of ``dtype``).

    ``value_dim`` may be 0 when it is not known yet: the first token sets it.
    """
    acc = accumulation_dtype(dtype)
    return LinearState(
        kv=torch.zeros(batch_size, num_heads, num_features, value_dim, device=device, dtype=acc),
        k_sum=torch.zeros(batch_size, num_heads, num_features, device=device, dtype=acc),
        offset=torch.full((batch_size, num_heads), log_floor(acc), device=device, dtype=acc),
    )


def checked_state(
    state: LinearState, fk: Tensor, dv: int, dtype: torch.dtype | None = None
) -> LinearState:
    """Validate ``state`` against keys ``(B, H, L, M)``; give an empty kv its value dim. The
    state comes back in ``dtype`` (default: the keys')."""
    if not isinstance(state, LinearState):
        raise ValueError(
            f"state must be a LinearState (from init_state), got {type(state).__name__}"
        )
    b, h, _, m = fk.shape
    if tuple(state.kv.shape[:-1]) != (b, h, m) or state.kv.shape[-1] not in (0, dv):
        raise ValueError(
            f"state.kv has shape {tuple(state.kv.shape)}, expected (B, H, M, Dv) = "
            f"{(b, h, m, dv)} (or an empty Dv from init_state)"
        )
    acc = fk.dtype if dtype is None else dtype
    kv = state.kv.to(acc)
    if kv.shape[-1] == 0:
        kv = kv.new_zeros(b, h, m, dv)
    return LinearState(kv, state.k_sum.to(acc), state.offset.to(acc))


def linear_attention_prefill(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearState | None = None,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """Causal linear attention over L tokens that follow ``state`` (fresh if None).

    Args:
        phi_q: ``(B, H, L, M)`` query features; phi_k: ``(B, H, L, M)`` key features, scaled
            by ``exp(k_log_scale)`` ``(B, H, L)`` if given; v: ``(B, H, L, Dv)``.
        state: the state after the tokens before these ones.
        key_padding_mask: ``(B, L)`` bool, True marks keys that must not count.
        chunk_size: C, tokens per chunk of the masked intra-chunk products.
        block_size: tokens per block of chunks computed together.
        eps: guard of the normaliser.

    Returns:
        The output ``(B, H, L, Dv)`` in the dtype of ``v`` and the state after the L tokens.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    num, den, _, final = causal_linear_sums(
        fq, fk, v32, s, state, chunk_size=chunk_size, block_size=block_size
    )
    # (num is a fresh sum: divide in place when no graph needs it)
    den = guard_normaliser(den, eps)
    out = num / den if torch.is_grad_enabled() else num.div_(den)
    return out.to(v.dtype), final


def causal_linear_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    state: LinearState | None = None,
    *,
    log_decay: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[Tensor, Tensor, Tensor | None, LinearState]:
    """The unnormalised causal sums behind :func:`linear_attention_prefill`.

    ``num_i = Σ_{j<=i} γ^(i−j) exp(s_j − r_i) (fq_i·fk_j) v_j`` and ``den_i`` the same without
    ``v_j``, where ``r_i`` is the running maximum of the log-scales (including the state's) and
    ``γ = exp(log_decay)`` (1 when None). Inputs are prepared already (accumulation dtype,
    padded keys zeroed, their log-scales at the floor).

    Args:
        fq, fk: ``(B, H, L, M)``; v: ``(B, H, L, Dv)``; s: ``(B, H, L)`` or None.
        state: the state before these tokens (fresh if None).
        log_decay: ``log γ <= 0`` broadcastable to ``(B, H)``, or None for no decay.

    Returns:
        ``num (B, H, L, Dv)``, ``den (B, H, L, 1)``, the offsets ``r (B, H, L)`` (None without
        log-scales) and the state after the L tokens.
    """
    if chunk_size < 1 or block_size < 1:
        raise ValueError(
            f"chunk_size and block_size must be positive, got {chunk_size}, {block_size}"
        )
    b, h, length, m = fq.shape
    dv = v.shape[-1]
    if state is None:
        state = linear_attention_init_state(b, h, m, dv, device=fq.device, dtype=fq.dtype)
    elif s is None:
        # a given state may carry any offset: give these keys explicit log-scales 0 so that
        # its sums are rescaled against them
        s = fk.new_zeros(b, h, length)
    state = checked_state(state, fk, dv)
    c = max(1, min(chunk_size, length))
    padded = -(-length // c) * c
    if padded != length:
        fq, fk, v = (F.pad(x, (0, 0, 0, padded - length)) for x in (fq, fk, v))
        if s is not None:
            s = F.pad(s, (0, padded - length), value=log_floor(s.dtype))
    n_flat = b * h
    fq, fk, v = (x.reshape(n_flat, padded, x.shape[-1]) for x in (fq, fk, v))
    s = None if s is None else s.reshape(n_flat, padded)
    g = None
    if log_decay is not None:
        g = log_decay.to(fq.dtype).expand(b, h).reshape(n_flat)
    kv, z, offset = (x.reshape(n_flat, *x.shape[2:]) for x in state)
    step = max(c, block_size // c * c)
    nums, dens, offsets = [], [], []
    for start in range(0, padded, step):
        part = slice(start, start + step)
        num, den, r, kv, z, offset = _causal_block(
            fq[:, part],
            fk[:, part],
            v[:, part],
            None if s is None else s[:, part],
            kv,
            z,
            offset,
            c,
            g,
        )
        nums.append(num)
        dens.append(den)
        offsets.append(r)
    num, den = ((x[0] if len(x) == 1 else torch.cat(x, dim=1))[:, :length] for x in (nums, dens))
    r_all = None
    if s is not None:
        r_all = (offsets[0] if len(offsets) == 1 else torch.cat(offsets, dim=1))[:, :length]
        r_all = r_all.reshape(b, h, length)
    if g is not None and padded != length:
        # the state after the padded end carries γ^pad too much: fold it into the offset
        offset = offset - g * (padded - length)
    final = LinearState(kv.view(b, h, m, dv), z.view(b, h, m), offset.view(b, h))
    return num.reshape(b, h, length, dv), den.reshape(b, h, length, 1), r_all, final


def linear_attention_chunked(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Causal linear attention in chunkwise-parallel form; see :func:`linear_attention_prefill`."""
    out, _ = linear_attention_prefill(
        phi_q,
        phi_k,
        v,
        k_log_scale=k_log_scale,
        key_padding_mask=key_padding_mask,
        chunk_size=chunk_size,
        block_size=block_size,
        eps=eps,
    )
    return out


def _causal_block(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    s: Tensor | None,
    kv: Tensor,
    z: Tensor,
    offset: Tensor,
    c: int,
    g: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """T tokens (a multiple of C) after the state ``(kv, z, offset)``; N = B·H rows.

    fq, fk: ``(N, T, M)``; v: ``(N, T, Dv)``; s: ``(N, T)``; kv: ``(N, M, Dv)``; z: ``(N, M)``;
    offset: ``(N,)``; g: ``(N,)`` log-decays or None. Returns ``num (N, T, Dv)``,
    ``den (N, T, 1)``, the per-query offsets ``r (N, T)`` and the state after the block.
    """
    n_flat, t, m = fq.shape
    dv = v.shape[-1]
    n = t // c
    # one batch of N·n chunks: 3-D matmuls are the fastest batched form
    fq, fk, v = (x.reshape(n_flat * n, c, x.shape[-1]) for x in (fq, fk, v))
    scores = torch.bmm(fq, fk.transpose(1, 2))  # (Nn, C, C)
    # (in-place updates below only touch tensors that no backward formula needs)
    if s is None:
        r = None
        weights = scores.tril_()
        k_in = fk
        q_rescale = None
        offsets = torch.cat([offset[:, None], offset.new_zeros(n_flat, n)], dim=1)
    elif g is None:
        # r_i, the key offset of query i: the running maximum of the log-scales up to i
        # (carried over from the state). It cancels in the ratio, so it carries no gradient.
        r = torch.maximum(torch.cummax(s.detach(), dim=1).values, offset[:, None])
        r_c, s = r.reshape(n_flat * n, c), s.reshape(n_flat * n, c)
        r_end = r_c[:, -1]  # (Nn,) the offset of each chunk's own sums
        # weight exp(s_j − r_i) <= 1 for j <= i (future entries are zeroed after the product)
        weights = scores.mul_(exp_nonpositive_(s[:, None, :] - r_c[:, :, None])).tril_()
        k_in = fk * exp_nonpositive_(s - r_end[:, None])[..., None]
        offsets = torch.cat([offset[:, None], r_end.view(n_flat, n)], dim=1)  # (N, n+1)
        q_rescale = exp_nonpositive_(offsets[:, :-1].reshape(-1, 1) - r_c)[..., None]
    else:
        r, weights, k_in, offsets, q_rescale, scan = _decayed_weights(scores, fk, s, offset, g, c)
    if s is None or g is None:
        # scan[c, e]: weight of the sums of entry e (incoming state, chunk 0, ...) in the
        # state before chunk c (entry n: the state after the block)
        scan = exp_nonpositive_(offsets[:, None, :] - offsets[:, :, None]).tril_()
    if g is not None and s is None:
        # decay γ^(i−j): inside chunks, from each chunk's end, between chunk ends, to queries
        pos = torch.arange(c, device=fq.device, dtype=fq.dtype)
        lag = (pos[:, None] - pos[None, :]).clamp_min(0)
        weights = (weights.view(n_flat, n, c, c) * _decay(g, lag)[:, None]).view(-1, c, c)
        k_in = (k_in.view(n_flat, n, c, m) * _decay(g, c - 1 - pos)[:, None, :, None]).view(
            -1, c, m
        )
        idx = torch.arange(n + 1, device=fq.device, dtype=fq.dtype)
        scan = scan * _decay(g, (idx[:, None] - idx[None, :]).clamp_min(0) * c)
        q_rescale = _decay(g, pos + 1)[:, None, :, None].expand(n_flat, n, c, 1).reshape(-1, c, 1)
    num = torch.bmm(weights, v)  # (Nn, C, Dv)
    den = weights.sum(dim=-1, keepdim=True)  # (Nn, C, 1)
    # sums of [incoming state, chunk 0, ..., chunk n−1], then inclusive prefix sums: entry c
    # is the state before chunk c (in offset offsets[c]); entry n the state after the block
    chunk_kv = torch.bmm(k_in.transpose(1, 2), v).view(n_flat, n, m * dv)
    all_kv = torch.bmm(scan, torch.cat([kv.reshape(n_flat, 1, m * dv), chunk_kv], dim=1))
    all_z = torch.bmm(scan, torch.cat([z[:, None], k_in.sum(dim=1).view(n_flat, n, m)], dim=1))
    prefix_kv = all_kv[:, :n].reshape(n_flat * n, m, dv)
    prefix_z = all_z[:, :n].reshape(n_flat * n, m, 1)
    if q_rescale is None:
        num, den = num.baddbmm_(fq, prefix_kv), den.baddbmm_(fq, prefix_z)
    else:
        num = num.addcmul_(q_rescale, torch.bmm(fq, prefix_kv))
        den = den.addcmul_(q_rescale, torch.bmm(fq, prefix_z))
    if r is None:
        r = offsets.new_zeros(n_flat, t)
    # copies, so that the state does not keep the per-chunk sums of the block alive
    return (
        num.view(n_flat, t, dv),
        den.view(n_flat, t, 1),
        r,
        all_kv[:, n].reshape(n_flat, m, dv).clone(),
        all_z[:, n].clone(),
        offsets[:, n],
    )


def _decayed_weights(
    scores: Tensor, fk: Tensor, s: Tensor, offset: Tensor, g: Tensor, c: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The weights of :func:`_causal_block` with log-scales ``s (N, T)`` and log-decays
    ``g (N,)``: every factor ``γ^(i−j) exp(s_j − r_i)`` is one exponential, and the offset is
    the *decayed* running maximum ``r_i = max_{j<=i} (s_j + (i−j)·log γ)`` (the state's offset
    included), so recent keys keep weights near 1 even after a large key has decayed away.

    ``r`` is computed as ``p·g + cummax(s_j − j·g)`` over the positions p of the block; its
    rounding cancels in the ratio (every weight of query i uses the same ``r_i``), so the
    exponentials are capped at ``e`` rather than 1.
    Returns ``r, weights, k_in, offsets, q_rescale, scan`` as the block uses them.
    """
    n_flat, t = s.shape
    n = t // c
    pos_t = torch.arange(t, device=s.device, dtype=s.dtype)
    gp = g[:, None] * pos_t  # (N, T)
    start = (offset + g)[:, None]  # the state's offset, one step later
    r = gp + torch.maximum(torch.cummax(s.detach() - gp, dim=1).values, start)
    r_c, s = r.reshape(n_flat * n, c), s.reshape(n_flat * n, c)
    r_end = r_c[:, -1]
    g_rows = g.repeat_interleave(n)[:, None]  # (Nn, 1)
    pos = torch.arange(c, device=s.device, dtype=s.dtype)
    lag = (pos[:, None] - pos[None, :]).clamp_min(0)
    logits = s[:, None, :] - r_c[:, :, None] + g_rows[..., None] * lag
    weights = scores.mul_(_exp_capped(logits)).tril_()
    k_in = fk * _exp_capped(s - r_end[:, None] + g_rows * (c - 1 - pos))[..., None]
    offsets = torch.cat([offset[:, None], r_end.view(n_flat, n)], dim=1)  # (N, n+1)
    q_rescale = _exp_capped(offsets[:, :-1].reshape(-1, 1) - r_c + g_rows * (pos + 1))[..., None]
    idx = torch.arange(n + 1, device=s.device, dtype=s.dtype)
    steps = (idx[:, None] - idx[None, :]).clamp_min(0) * c
    scan = offsets[:, None, :] - offsets[:, :, None] + g[:, None, None] * steps
    return r, weights, k_in, offsets, q_rescale, _exp_capped(scan).tril()


def _exp_capped(x: Tensor) -> Tensor:
    """``exp`` of exponents that are <= 0 up to rounding: floored like
    :func:`exp_nonpositive`, capped at 1 (``e``) instead of 0."""
    return torch.exp(x.clamp(exp_floor(x.dtype), 1.0))


def _decay(g: Tensor, lag: Tensor) -> Tensor:
    """``γ^lag = exp(g·lag)`` for log-decays ``g (N,)`` and lags ``>= 0``: shape ``(N, *lag)``."""
    return exp_nonpositive(g.view(-1, *([1] * lag.dim())) * lag)
