"""Gated linear attention: a scalar forget gate per token and head (RFA-Gate).

``S_t = g_t S_{t−1} + (1 − g_t) φ(k_t) v_tᵀ``, ``z_t = g_t z_{t−1} + (1 − g_t) φ(k_t)``,
``out_t = φ(q_t)·S_t / φ(q_t)·z_t`` with ``g_t = σ(x_t)`` for gate logits x (Peng et al.,
Random Feature Attention, ICLR 2021, §3.3). Unrolled, key j reaches query i >= j with weight
``(1 − g_j) Π_{j<l<=i} g_l = exp(log(1 − g_j) + c_i − c_j)``, c the cumulative log-gates.

* :func:`gated_linear_attention` — chunkwise-parallel: inside a chunk of C tokens the masked
  C×C products with weights ``exp(log(1 − g_j) − b_j − ρ_i)`` (b the log-gates summed from the
  chunk's start, so no cumulative sum spans more than C tokens); across chunks the states are
  carried with the chunk-end factors ``exp(b_end − b_j)`` and combined by one small scan whose
  segment sums start at each chunk (never a difference of two long cumulative sums). Every
  exponent is <= 0: ``ρ_i`` is the largest log-weight query i sees, taken over keys j <= i only
  (no future token moves an offset). The query's own factor ``exp(c_i)`` cancels in the ratio.
  O(L·C·(M + Dv) + L·M·Dv) time, O(L·(M + Dv)) memory.
* :func:`gated_linear_attention_prefill` / :func:`gated_linear_attention_step` — the same from
  a :class:`~kattn.functional.linear_causal.LinearState` (``S = exp(offset)·kv``), one token in
  O(M·Dv).
* ``causal=False`` (not in the paper, whose gate is causal only): the recurrence run both ways,
  ``out_i ∝ φ(q_i)·(S_i + g_i R_{i+1})`` with ``R`` the same recurrence from the right; key
  j > i then weighs ``(1 − g_j) Π_{i<=l<j} g_l``, the mirror image of the causal weight.
* :func:`gated_linear_attention_reference` runs the recurrence token by token;
  :func:`gated_log_weights` gives the dense ``(L, L)`` log-weights.

Padded keys have ``g = 1`` and write nothing: the state passes them unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .linear_causal import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    LinearState,
    checked_state,
    linear_attention_init_state,
)
from .linear_step import causal_step_sums
from .numerics import (
    DEFAULT_EPS,
    accumulation_dtype,
    exp_nonpositive,
    guard_normaliser,
    log_floor,
    prepare_linear_inputs,
)


def gate_log_terms(
    gate_logits: Tensor, k_log_scale: Tensor | None, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(log g, log(1 − g) + s)`` ``(B, H, L)`` in the accumulation dtype, from the logits of
    ``g = σ(x)`` (logsigmoid on both sides, so neither loses digits near 0 or 1) and the key
    log-scales s; padded keys get ``log g = 0`` and a write weight at the log floor."""
    x = gate_logits.to(accumulation_dtype(gate_logits.dtype))
    if key_padding_mask is not None:  # (a NaN logit there would reach gradients as NaN·0)
        x = x.masked_fill(key_padding_mask[:, None, :], 0.0)
    log_g, log_w = F.logsigmoid(x), F.logsigmoid(-x)
    if k_log_scale is not None:
        log_w = log_w + k_log_scale.to(x.dtype)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        log_g = log_g.masked_fill(pad, 0.0)
        log_w = log_w.masked_fill(pad, log_floor(x.dtype))
    return log_g, log_w


def gated_linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    gate_logits: Tensor,
    *,
    causal: bool = True,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Gated linear attention in chunkwise-parallel form (see the module docstring).

    Args:
        phi_q, phi_k: ``(B, H, L, M)`` features, the keys' scaled by ``exp(k_log_scale)``
            ``(B, H, L)`` if given; v: ``(B, H, L, Dv)``.
        gate_logits: ``(B, H, L)``, ``g_t = σ(gate_logits_t)``.
        causal: the paper's recurrence; False adds the right-to-left one (key i counted once).
        key_padding_mask: ``(B, L)`` bool, True marks keys that must not count.
        chunk_size, block_size: tokens per chunk and per block of chunks computed together.
        eps: guard of the normaliser, in units where the largest visible key weight is 1.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of ``v``.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    log_g, log_w = gate_log_terms(gate_logits, s, key_padding_mask)
    num, den, unit, _ = _gated_sums(
        fq, fk, v32, log_g, log_w, None, chunk_size=chunk_size, block_size=block_size
    )
    if not causal:
        # the right-to-left recurrence, strictly later keys: its sums for query i are
        # g_i·φ(q_i)·R_{i+1} (the state's gate at i is part of the causal weight formula)
        rq, rk, rv, rg, rw = (x.flip(2) for x in (fq, fk, v32, log_g, log_w))
        back = _gated_sums(
            rq, rk, rv, rg, rw, None, chunk_size=chunk_size, block_size=block_size,
            exclusive=True,
        )  # fmt: skip
        num_b, den_b, unit_b = (x.flip(2) for x in back[:3])
        # each side's sums are exp(unit) times the true ones: combine them in one unit
        shift = torch.maximum(unit, unit_b).detach()
        w_f, w_b = (exp_nonpositive(u - shift)[..., None] for u in (unit, unit_b))
        num, den = w_f * num + w_b * num_b, w_f * den + w_b * den_b
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def gated_linear_attention_prefill(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    gate_logits: Tensor,
    state: LinearState | None = None,
    *,
    k_log_scale: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """Causal gated linear attention over L tokens that follow ``state`` (fresh if None).

    Args as :func:`gated_linear_attention`; ``state`` from
    :func:`~kattn.functional.linear_causal.linear_attention_init_state`, an earlier prefill or
    :func:`gated_linear_attention_step`.

    Returns:
        The output ``(B, H, L, Dv)`` and the state after the L tokens.
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, key_padding_mask)
    log_g, log_w = gate_log_terms(gate_logits, s, key_padding_mask)
    num, den, _, final = _gated_sums(
        fq, fk, v32, log_g, log_w, state, chunk_size=chunk_size, block_size=block_size
    )
    return (num / guard_normaliser(den, eps)).to(v.dtype), final


def gated_linear_attention_step(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    gate_logits: Tensor,
    state: LinearState,
    *,
    k_log_scale: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, LinearState]:
    """One causal token in O(M·Dv): ``S ← g S + (1 − g) φ(k) vᵀ`` in log-offset form.

    Args:
        phi_q, phi_k: ``(B, H, 1, M)``; v: ``(B, H, 1, Dv)``; gate_logits, k_log_scale:
            ``(B, H, 1)``; state: the state after the previous tokens.

    Returns:
        The output ``(B, H, 1, Dv)`` and the state including this token (updated in place
        when no graph needs it, like :func:`~kattn.functional.linear_step.linear_attention_step`).
    """
    fq, fk, v32, s = prepare_linear_inputs(phi_q, phi_k, v, k_log_scale, None)
    log_g, log_w = gate_log_terms(gate_logits, s, None)
    num, den, state = causal_step_sums(fq, fk, v32, log_w, state, log_decay=log_g[:, :, 0])
    return (num / guard_normaliser(den, eps)).to(v.dtype), state


def gated_log_weights(
    gate_logits: Tensor, *, causal: bool = True, key_padding_mask: Tensor | None = None
) -> Tensor:
    """Dense log-weights ``(B, H, L, L)`` of key j at query i: ``log(1 − g_j) + c_i − c_j`` for
    j <= i, ``log(1 − g_j) + c_{j−1} − c_{i−1}`` for j > i when not causal; the log floor where
    key j is not visible (later keys when causal, padding)."""
    log_g, log_w = gate_log_terms(gate_logits, None, key_padding_mask)
    cum = log_g.cumsum(dim=-1)  # (B, H, L)
    before = cum - log_g  # c_{i−1}
    past = log_w[..., None, :] + cum[..., :, None] - cum[..., None, :]
    length = cum.shape[-1]
    lower = torch.ones(length, length, dtype=torch.bool, device=cum.device).tril()
    if causal:
        future = torch.full_like(past, log_floor(past.dtype))
    else:
        future = log_w[..., None, :] + before[..., None, :] - before[..., :, None]
    out = torch.where(lower, past, future)
    if key_padding_mask is not None:
        out = out.masked_fill(key_padding_mask[:, None, None, :], log_floor(out.dtype))
    return out


def gated_linear_attention_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    gate_logits: Tensor,
    *,
    causal: bool = True,
    key_padding_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """The recurrence of Peng et al. (2021, §3.3) token by token, on plain features (``phi_k``
    includes any scale): slow and obvious, for tests. Non-causal adds ``g_i φ(q_i)·R_{i+1}``
    from the right-to-left recurrence. Shapes as :func:`gated_linear_attention`."""
    acc = accumulation_dtype(v.dtype)
    fq, fk, v32 = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    x = gate_logits.to(acc)
    if key_padding_mask is not None:
        x = x.masked_fill(key_padding_mask[:, None, :], 0.0)
    g, keep = torch.sigmoid(x), torch.sigmoid(-x)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]
        g, keep = g.masked_fill(pad, 1.0), keep.masked_fill(pad, 0.0)
        fk, v32 = fk.masked_fill(pad[..., None], 0.0), v32.masked_fill(pad[..., None], 0.0)
    b, h, length, m = fk.shape
    s_state = fk.new_zeros(b, h, m, v32.shape[-1])
    z_state = fk.new_zeros(b, h, m)
    nums, dens = [], []
    for t in range(length):
        write = keep[:, :, t, None] * fk[:, :, t]  # (B, H, M)
        s_state = g[:, :, t, None, None] * s_state + write[..., None] * v32[:, :, t, None, :]
        z_state = g[:, :, t, None] * z_state + write
        nums.append(torch.einsum("bhm,bhmd->bhd", fq[:, :, t], s_state))
        dens.append(torch.einsum("bhm,bhm->bh", fq[:, :, t], z_state))
    if not causal:
        r_state, r_z = torch.zeros_like(s_state), torch.zeros_like(z_state)
        for t in reversed(range(length)):
            gate = g[:, :, t]
            nums[t] = nums[t] + gate[..., None] * torch.einsum(
                "bhm,bhmd->bhd", fq[:, :, t], r_state
            )
            dens[t] = dens[t] + gate * torch.einsum("bhm,bhm->bh", fq[:, :, t], r_z)
            write = keep[:, :, t, None] * fk[:, :, t]
            r_state = gate[..., None, None] * r_state + write[..., None] * v32[:, :, t, None, :]
            r_z = gate[..., None] * r_z + write
    num, den = torch.stack(nums, dim=2), torch.stack(dens, dim=2)[..., None]
    return (num / guard_normaliser(den, eps)).to(v.dtype)


def _gated_sums(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    log_g: Tensor,
    log_w: Tensor,
    state: LinearState | None,
    *,
    chunk_size: int,
    block_size: int,
    exclusive: bool = False,
) -> tuple[Tensor, Tensor, Tensor, LinearState]:
    """Unnormalised causal sums of prepared inputs (accumulation dtype, padded keys zeroed):
    ``num (B, H, L, Dv)``, ``den (B, H, L, 1)``, ``unit (B, H, L)`` with the true sums
    ``exp(unit)·(num, den)``, and the state after the L tokens. ``exclusive``: key j counts
    for queries i > j only (the right-to-left side of the non-causal form)."""
    if chunk_size < 1 or block_size < 1:
        raise ValueError(
            f"chunk_size and block_size must be positive, got {chunk_size}, {block_size}"
        )
    b, h, length, m = fq.shape
    dv = v.shape[-1]
    if state is None:
        state = linear_attention_init_state(b, h, m, dv, device=fq.device, dtype=fq.dtype)
    kv, z, offset = (x.reshape(b * h, *x.shape[2:]) for x in checked_state(state, fk, dv))
    c = max(1, min(chunk_size, length))
    padded = -(-length // c) * c
    if padded != length:  # the tail: g = 1, nothing written, so the state passes unchanged
        fq, fk, v = (F.pad(x, (0, 0, 0, padded - length)) for x in (fq, fk, v))
        log_g = F.pad(log_g, (0, padded - length))
        log_w = F.pad(log_w, (0, padded - length), value=log_floor(log_w.dtype))
    n_flat = b * h
    fq, fk, v = (x.reshape(n_flat, padded, x.shape[-1]) for x in (fq, fk, v))
    log_g, log_w = log_g.reshape(n_flat, padded), log_w.reshape(n_flat, padded)
    step = max(c, block_size // c * c)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    for start in range(0, padded, step):
        part = slice(start, start + step)
        num, den, unit, kv, z, offset = _gated_block(
            fq[:, part], fk[:, part], v[:, part], log_g[:, part], log_w[:, part],
            kv, z, offset, c, exclusive,
        )  # fmt: skip
        parts.append((num, den, unit))
    num, den, unit = (
        (x[0] if len(x) == 1 else torch.cat(x, dim=1))[:, :length] for x in zip(*parts, strict=True)
    )
    final = LinearState(kv.view(b, h, m, dv), z.view(b, h, m), offset.view(b, h))
    return (
        num.reshape(b, h, length, dv),
        den.reshape(b, h, length, 1),
        unit.reshape(b, h, length),
        final,
    )


def _gated_block(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    log_g: Tensor,
    log_w: Tensor,
    kv: Tensor,
    z: Tensor,
    offset: Tensor,
    c: int,
    exclusive: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """T tokens (a multiple of C) after the state ``exp(offset)·(kv, z)``; N = B·H rows.

    fq, fk: ``(N, T, M)``; v: ``(N, T, Dv)``; log_g, log_w: ``(N, T)``; kv: ``(N, M, Dv)``;
    z: ``(N, M)``; offset: ``(N,)``. Returns ``num (N, T, Dv)``, ``den (N, T, 1)``,
    ``unit (N, T)`` and the state after the block.
    """
    n_flat, t, m = fq.shape
    dv = v.shape[-1]
    n = t // c
    log_g, log_w = log_g.view(n_flat, n, c), log_w.view(n_flat, n, c)
    local = log_g.cumsum(dim=-1)  # b_p: log-gates summed from the chunk's start (C terms)
    u = log_w - local  # key j's log-weight at the chunk start: true weight at p is exp(u_j + b_p)
    ud = u.detach()
    top = ud.amax(dim=-1)  # (N, n): each chunk's largest key log-weight
    ends = local[..., -1]  # (N, n): the chunk's total log-gate
    # entries of the scan: the incoming state (time: before the block) and each chunk's own
    # sums (time: its end); d[c, e] = Σ_{e<=k<c} ends_k carries entry e to chunk c's start
    entry = torch.cat([offset[:, None], top + ends], dim=1)  # (N, n+1)
    steps = torch.ones(n, n + 1, dtype=torch.bool, device=fq.device).tril()  # k >= e
    d = (ends[:, :, None] * steps).cumsum(dim=1)  # (N, n, n+1): Σ_{k'=e}^{k} ends_k'
    d = F.pad(d, (0, 0, 1, 0))  # (N, n+1, n+1), row c: Σ_{k=e}^{c−1}
    logits = entry[:, None, :] + d
    visible = torch.ones(n + 1, n + 1, dtype=torch.bool, device=fq.device).tril()
    offsets = logits.detach().masked_fill(~visible, log_floor(logits.dtype)).amax(dim=-1)
    scan = exp_nonpositive(logits - offsets[:, :, None]).masked_fill(~visible, 0.0)
    # each chunk's own sums in units of its largest key, then all prefix states at once
    fq, fk, v = (x.reshape(n_flat * n, c, x.shape[-1]) for x in (fq, fk, v))
    k_in = fk * exp_nonpositive(u - top[..., None]).view(n_flat * n, c, 1)
    chunk_kv = torch.bmm(k_in.transpose(1, 2), v).view(n_flat, n, m * dv)
    all_kv = torch.bmm(scan, torch.cat([kv.reshape(n_flat, 1, m * dv), chunk_kv], dim=1))
    all_z = torch.bmm(scan, torch.cat([z[:, None], k_in.sum(dim=1).view(n_flat, n, m)], dim=1))
    # ρ_p: the largest log-weight query p sees (the prefix state's, keys j <= p), at the
    # chunk start; exclusive sides see keys j < p only
    running = torch.cummax(ud, dim=-1).values
    if exclusive:
        running = F.pad(running[..., :-1], (1, 0), value=log_floor(ud.dtype))
    rho = torch.maximum(running, offsets[:, :n, None])  # (N, n, C)
    weights = exp_nonpositive(u[..., None, :] - rho[..., :, None])  # (N, n, C, C)
    scores = torch.bmm(fq, fk.transpose(1, 2)) * weights.view(n_flat * n, c, c)
    scores = scores.tril(-1 if exclusive else 0)
    num = torch.bmm(scores, v)  # (Nn, C, Dv)
    den = scores.sum(dim=-1, keepdim=True)  # (Nn, C, 1)
    q_rescale = exp_nonpositive(offsets[:, :n, None] - rho).view(n_flat * n, c, 1)
    prefix_kv = all_kv[:, :n].reshape(n_flat * n, m, dv)
    prefix_z = all_z[:, :n].reshape(n_flat * n, m, 1)
    num = num + q_rescale * torch.bmm(fq, prefix_kv)
    den = den + q_rescale * torch.bmm(fq, prefix_z)
    unit = (rho + local).view(n_flat, t)  # true sums = exp(ρ_p + b_p) × these
    return (
        num.view(n_flat, t, dv),
        den.view(n_flat, t, 1),
        unit,
        all_kv[:, n].reshape(n_flat, m, dv).clone(),
        all_z[:, n].clone(),
        offsets[:, n],
    )
