"""Sparse Sinkhorn attention (Tay, Bahri, Yang, Metzler, Juan, "Sparse Sinkhorn Attention",
ICML 2020): the sequence is cut into N blocks of b tokens, a sorting matrix P ``(N, N)``
(a soft permutation, balanced by Sinkhorn normalisation) brings a block ψ_S(K)_n = Σ_m P_nm K_m
to the place of block n, and each query attends, in one softmax, to the b keys of that sorted
block and to the b keys of its own (local) block. O(L·b·D + N²·D) time, O(L·b + N²) memory.

The maths here takes P as given (the module computes it from the keys): block summaries
(:func:`sinkhorn_block_summaries`), the Sinkhorn balancing in log space
(:func:`sinkhorn_normalise`, with :func:`sinkhorn_normalise_reference` in probability space)
and the blocked attention (:func:`sinkhorn_attention`, with the dense
:func:`sinkhorn_attention_reference`).

Padded keys count nowhere: they are zeroed before any sum, left out of the block summaries,
a block without a key takes no part in the balancing (neither as a row nor as a column), and
a slot t of a sorted block is a key only if some block m with ``P_nm > 0`` has a real key at
offset t (the missing positions of a last, partial block are padding too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .numerics import accumulation_dtype, log_floor


def sinkhorn_num_blocks(length: int, block_size: int) -> int:
    """N = ⌈L / b⌉, the number of blocks (the last one may be partial)."""
    return -(-length // block_size)


def _valid(
    batch: int, length: int, padded: int, mask: Tensor | None, device: torch.device
) -> Tensor:
    """``(B, Lp)`` bool: True at real keys (not padding, not beyond L)."""
    valid = torch.zeros(batch, padded, dtype=torch.bool, device=device)
    valid[:, :length] = True if mask is None else ~mask
    return valid


def _pad_zero(x: Tensor, valid: Tensor) -> Tensor:
    """``x`` ``(B, H, L, ·)`` zero-padded to ``Lp`` positions and zeroed where not valid (a NaN
    stored at a padded key must not reach anything through 0 × NaN)."""
    padded = valid.shape[1]
    out = torch.zeros(*x.shape[:2], padded, x.shape[3], dtype=x.dtype, device=x.device)
    out[:, :, : x.shape[2]] = x
    return out.masked_fill(~valid[:, None, :, None], 0.0)


def sinkhorn_block_summaries(
    k: Tensor, block_size: int, *, causal: bool = False, key_padding_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """What the sorting network reads: one vector per block, and which blocks hold a key.

    Non-causal: the mean of the block's real keys (the paper pools the block by a sum; the
    mean keeps the logits' scale independent of b and of how much of the block is padding).
    Causal: the mean of the real keys at positions ``<= n·b``, the block's first token and
    everything before it (every query of block n may see those), so the sorting of block n
    reads no future token.

    Args:
        k: ``(B, H, L, D)``.
        block_size: b.
        causal: the causal summary above.
        key_padding_mask: ``(B, L)`` bool, True at padding.

    Returns:
        summaries ``(B, H, N, D)`` (zeros where no key is summarised) and present ``(B, N)``
        bool, True for blocks with at least one real key.
    """
    b, h, length, d = k.shape
    n = sinkhorn_num_blocks(length, block_size)
    valid = _valid(b, length, n * block_size, key_padding_mask, k.device)
    kz = _pad_zero(k, valid)
    if causal:
        first = torch.arange(n, device=k.device) * block_size
        sums = kz.cumsum(dim=2)[:, :, first]  # (B, H, N, D)
        counts = valid.cumsum(dim=1)[:, first]  # (B, N)
    else:
        sums = kz.view(b, h, n, block_size, d).sum(dim=3)
        counts = valid.view(b, n, block_size).sum(dim=2)
    summaries = sums / counts.clamp_min(1)[:, None, :, None].to(sums.dtype)
    return summaries, valid.view(b, n, block_size).any(dim=2)


def sinkhorn_allowed(present: Tensor, *, causal: bool) -> Tensor:
    """``(B, 1, N, N)`` bool: which entries of P may be nonzero. Both blocks must hold a key,
    and when ``causal`` only an earlier block may be brought to place n (``m < n``), so block
    0 gets no sorted block."""
    allowed = present[:, :, None] & present[:, None, :]
    if causal:
        n = present.shape[1]
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=present.device).tril(-1)
    return allowed[:, None]


def sinkhorn_normalise(
    log_alpha: Tensor, allowed: Tensor, *, iterations: int, causal: bool = False
) -> Tensor:
    """Sinkhorn balancing in log space (Tay et al. 2020; Adams and Zemel 2011):
    ``iterations`` times, normalise the rows of ``exp(log_alpha)``, then its columns, over the
    ``allowed`` entries only; returns ``P = exp(·)``, exactly 0 where not allowed.

    Causal balancing: row n may depend on rows ``<= n`` only, so the column sums that scale
    row n run over the rows up to n (a cumulative log-sum-exp), not over later rows.

    Args:
        log_alpha: ``(B, H, N, N)`` logits (already divided by the temperature).
        allowed: bool, broadcastable to ``log_alpha`` (:func:`sinkhorn_allowed`).
        iterations: row-then-column rounds (0 gives ``exp(log_alpha)`` masked).
        causal: the causal column normalisation above.

    Returns:
        ``(B, H, N, N)``; with enough iterations and no mask (non-causal) doubly stochastic.
    """
    floor = log_floor(log_alpha.dtype)  # finite: masked entries never give inf − inf
    x = log_alpha.masked_fill(~allowed, floor)
    for _ in range(iterations):
        x = (x - torch.logsumexp(x, dim=-1, keepdim=True)).masked_fill(~allowed, floor)
        if causal:
            columns = torch.logcumsumexp(x, dim=-2)
        else:
            columns = torch.logsumexp(x, dim=-2, keepdim=True)
        x = (x - columns).masked_fill(~allowed, floor)
    return torch.exp(x).masked_fill(~allowed, 0.0)


def sinkhorn_normalise_reference(
    log_alpha: Tensor, allowed: Tensor, *, iterations: int, causal: bool = False
) -> Tensor:
    """:func:`sinkhorn_normalise` in probability space, one row and one column at a time
    (slow; for tests with moderate logits, whose exponentials do not overflow)."""
    p = torch.exp(log_alpha) * allowed
    n = p.shape[-1]
    for _ in range(iterations):
        rows = []
        for i in range(n):
            total = p[..., i, :].sum(dim=-1, keepdim=True)
            rows.append(torch.where(total > 0, p[..., i, :] / total.clamp_min(1e-300), 0.0))
        p = torch.stack(rows, dim=-2)
        rows = []
        for i in range(n):
            upto = p[..., : i + 1, :] if causal else p
            total = upto.sum(dim=-2)
            rows.append(torch.where(total > 0, p[..., i, :] / total.clamp_min(1e-300), 0.0))
        p = torch.stack(rows, dim=-2)
    return p


def _masked_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last dim, 0 where not allowed; a row with nothing allowed gives zeros
    (and zero, finite gradients: it is computed over every entry, then cleared)."""
    seen = allowed.any(dim=-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(~(allowed | ~seen), float("-inf")), dim=-1)
    return weights.masked_fill(~seen, 0.0)


def sinkhorn_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sorting: Tensor,
    *,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    sortcut: int | None = None,
    scale: float | None = None,
) -> Tensor:
    """Blocked Sinkhorn attention with a given sorting matrix (Tay et al. 2020).

    Query block n attends, in one softmax, to the sorted block ``Σ_m P_nm K_m`` (values alike)
    and to its own block; with ``causal``, keys ``j <= i`` inside its own block (the sorted
    block then holds earlier blocks only: P is zero on and above the diagonal). With
    ``sortcut`` = s (SortCut), every query attends to the first s sorted blocks only,
    ``softmax(Q ψ_S(K)[:s·b]ᵀ) ψ_S(V)[:s·b]`` (all N blocks if s > N).

    Args:
        q, k: ``(B, H, L, D)``; v: ``(B, H, L, Dv)`` (self-attention: Lq == Lk).
        sorting: P ``(B, H, N, N)``, N = ⌈L/b⌉; row n weighs the blocks brought to place n.
        block_size: b.
        causal: the causal form above (not with ``sortcut``).
        key_padding_mask: ``(B, L)`` bool, True at padding (see the module docstring).
        sortcut: the SortCut budget s in blocks, or None.
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, L, Dv)`` in the input dtype (sums in fp32 for half precision); a query that
        sees no key gets zeros.
    """
    b, h, length, d = q.shape
    dv = v.shape[-1]
    n = sinkhorn_num_blocks(length, block_size)
    if tuple(sorting.shape[-2:]) != (n, n):
        raise ValueError(f"sorting must be (B, H, {n}, {n}) for L = {length}, got {sorting.shape}")
    if causal and sortcut is not None:
        raise ValueError("SortCut has no causal form: the first sorted blocks mix every block")
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    valid = _valid(b, length, n * block_size, key_padding_mask, q.device)
    qb = _pad_zero(q.to(acc), torch.ones_like(valid)).view(b, h, n, block_size, d) * scale
    kb = _pad_zero(k.to(acc), valid).view(b, h, n, block_size, d)
    vb = _pad_zero(v.to(acc), valid).view(b, h, n, block_size, dv)
    p = sorting.to(acc)
    ks = torch.einsum("bhnm,bhmtd->bhntd", p, kb)  # (B, H, N, b, D)
    vs = torch.einsum("bhnm,bhmtd->bhntd", p, vb)  # (B, H, N, b, Dv)
    weight = torch.einsum("bhnm,bmt->bhnt", p, valid.view(b, n, block_size).to(acc))
    slot_ok = weight > 0  # (B, H, N, b): sorted slots that hold a real key
    if sortcut is not None:
        s = min(sortcut, n)
        ks, vs = ks[:, :, :s].reshape(b, h, 1, s * block_size, d), vs[:, :, :s]
        vs = vs.reshape(b, h, 1, s * block_size, dv)
        logits = torch.einsum("bhntd,bhnsd->bhnts", qb, ks.expand(b, h, n, -1, d))
        allowed = slot_ok[:, :, :s].reshape(b, h, 1, 1, s * block_size)
        weights = _masked_softmax(logits, allowed.expand_as(logits))
        out = torch.einsum("bhnts,bhnse->bhnte", weights, vs.expand(b, h, n, -1, dv))
    else:
        local_ok = valid.view(b, 1, n, 1, block_size)
        if causal:
            tri = torch.ones(block_size, block_size, dtype=torch.bool, device=q.device).tril()
            local_ok = local_ok & tri
        allowed = torch.cat(
            [slot_ok[:, :, :, None, :].expand(b, h, n, block_size, block_size),
             local_ok.expand(b, h, n, block_size, block_size)],
            dim=-1,
        )  # fmt: skip
        logits = torch.einsum("bhntd,bhnsd->bhnts", qb, torch.cat([ks, kb], dim=3))
        weights = _masked_softmax(logits, allowed)  # (B, H, N, b, 2b)
        out = torch.einsum("bhnts,bhnse->bhnte", weights, torch.cat([vs, vb], dim=3))
    return out.reshape(b, h, n * block_size, dv)[:, :, :length].to(q.dtype)


def sinkhorn_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sorting: Tensor,
    *,
    block_size: int,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    sortcut: int | None = None,
    scale: float | None = None,
) -> Tensor:
    """:func:`sinkhorn_attention` written densely: the block sorting as one ``(Lp, Lp)``
    matrix ``P ⊗ I_b`` applied to the whole (zero-padded) key and value sequences, then one
    ``(L, 2·Lp)`` masked softmax over ``[ψ_S(K); K]`` whose mask is the paper's pattern (the
    sorted and the own block of each query; the first s sorted blocks with SortCut).
    Arguments as for :func:`sinkhorn_attention`. O(L²) memory."""
    b, h, length, d = q.shape
    n = sinkhorn_num_blocks(length, block_size)
    padded = n * block_size
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    valid = _valid(b, length, padded, key_padding_mask, q.device)
    kz, vz = _pad_zero(k.to(acc), valid), _pad_zero(v.to(acc), valid)
    block = torch.arange(padded, device=q.device) // block_size
    offset = torch.arange(padded, device=q.device) % block_size
    same_offset = (offset[:, None] == offset[None, :]).to(acc)
    big = sorting.to(acc)[:, :, block][:, :, :, block] * same_offset  # (B, H, Lp, Lp)
    k_sorted, v_sorted = big @ kz, big @ vz
    slot_ok = (big @ valid[:, None, :, None].to(acc))[..., 0] > 0  # (B, H, Lp)
    rows = torch.arange(length, device=q.device)
    own = block[None, :] == block[rows][:, None]  # (L, Lp)
    if sortcut is not None:
        sorted_ok = (torch.arange(padded, device=q.device) < sortcut * block_size)[None, :]
        sorted_ok = sorted_ok.expand(length, padded)
        local_ok = torch.zeros(b, 1, length, padded, dtype=torch.bool, device=q.device)
    else:
        sorted_ok = own
        local_ok = own & valid[:, None, None, :]
        if causal:
            local_ok = local_ok & (torch.arange(padded, device=q.device)[None, :] <= rows[:, None])
    allowed = torch.cat(
        [sorted_ok & slot_ok[:, :, None, :], local_ok.expand(b, h, length, padded)], dim=-1
    )
    keys, values = torch.cat([k_sorted, kz], dim=2), torch.cat([v_sorted, vz], dim=2)
    logits = q.to(acc) @ keys.transpose(-1, -2) * scale  # (B, H, L, 2·Lp)
    return (_masked_softmax(logits, allowed) @ values).to(q.dtype)
