"""ProbSparse self-attention (Zhou et al., Informer: Beyond Efficient Transformer for Long
Sequence Time-Series Forecasting, AAAI 2021, §3.1).

Each query's sparsity measurement ``M̄(q_i) = max_j s_ij − mean_j s_ij`` (``s_ij =
q_i·k_j/√D``, eq. 4) is estimated on U = c·⌈ln Lk⌉ keys sampled for it (uniformly, with
replacement, a separate sample per query shared over the batch and the heads, as in the
released ``ProbAttention``); the u = c·⌈ln Lq⌉ queries of largest M̄ get exact softmax
attention over every key, the other ("lazy") queries get the mean of V. U and u are clamped
to Lk and Lq. With padding each example may have its own U and u (from its real lengths,
``InformerSample.num_samples`` and a ``(B,)`` ``num_top``), so that its output does not
depend on the padding of its batch. O((Lq·U + u·Lk)·D) time and memory, no (Lq, Lk) tensor.

Masked form (the paper's decoder self-attention): the sample of query i is drawn among the
keys ``j <= i``, the exact rows are causal and a lazy query gets the mean of ``v_1 … v_i``.
Every output then reads only values up to its position, but the choice of the top-u queries
ranks each query against all the others, later ones included, so whether query i is exact
depends on later tokens: it is not a causal mechanism in the strict sense
(``kattn.build("informer")`` refuses ``causal=True`` for that reason).

Padding: padded keys are never sampled and never counted (the mean of V is over the real
keys); with Lq == Lk (self-attention) the mask marks padded queries too, which are ranked
last. A query with no real key gets a zero output.

Shapes: B batch, H heads, Lq/Lk lengths, D head dim, Dv value dim, U sampled keys per query,
u exact queries.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..checks import positive_int
from .numerics import accumulation_dtype

__all__ = [
    "InformerSample",
    "informer_attention",
    "informer_attention_reference",
    "informer_factor",
    "informer_sample",
    "informer_sizes",
    "informer_sparsity",
]

#: the number of sampled keys the Skyformer LRA runs aim at (``in_nb_features``).
SKYFORMER_FEATURES = 128
#: the released Informer's default factor c.
INFORMER_FACTOR = 5


class InformerSample(NamedTuple):
    """The keys sampled for each query.

    Attributes:
        keys: ``(B, Lq, U)`` int64, key positions (real keys only; 0 where ``valid`` is
            False).
        valid: ``(B, Lq)`` bool, False for a query with no real key to sample.
        num_samples: ``(B,)`` int64, the leading samples each example uses (its own U);
            None: all U.
    """

    keys: Tensor
    valid: Tensor
    num_samples: Tensor | None = None


def informer_factor(max_len: int | None) -> int:
    """The sampling factor c: ``⌈128 / ln max_len⌉`` (so that U = c·⌈ln L⌉ is about 128
    keys at L = max_len, the Skyformer LRA runs' choice) when ``max_len`` > 1 is known, else
    the released Informer's 5."""
    if max_len is None or max_len < 2:
        return INFORMER_FACTOR
    return math.ceil(SKYFORMER_FEATURES / math.log(max_len))


def informer_sizes(lq: int, lk: int, factor: int) -> tuple[int, int]:
    """``(U, u) = (min(c·⌈ln Lk⌉, Lk), min(c·⌈ln Lq⌉, Lq))``, at least 1 each."""
    positive_int("factor", factor)
    samples = max(1, min(factor * math.ceil(math.log(lk)), lk))
    top = max(1, min(factor * math.ceil(math.log(lq)), lq))
    return samples, top


def _padding(
    batch: int, lq: int, lk: int, key_padding_mask: Tensor | None, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Bool ``(B, Lq)`` and ``(B, Lk)``: True on padded queries (self-attention) and keys."""
    pad_k = torch.zeros(batch, lk, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        pad_k = key_padding_mask.to(device)
    pad_q = pad_k if lq == lk else torch.zeros(batch, lq, dtype=torch.bool, device=device)
    return pad_q, pad_k


def informer_sample(
    uniforms: Tensor,
    *,
    batch: int,
    lk: int,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    num_samples: Tensor | None = None,
) -> InformerSample:
    """Turn uniforms into sampled keys: query i takes, for each ``u`` in its row, the
    ``⌊u·n_i⌋``-th of its n_i allowed keys (the real keys, those ``j <= i`` when causal), so
    the same uniforms give the same sample in any batch.

    Args:
        uniforms: ``(Lq, U)`` in [0, 1).
        batch: B; lk: Lk.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.
        causal: sample among the keys ``j <= i`` (needs Lq == Lk).
        num_samples: ``(B,)`` ints in [1, U], the leading columns each example uses (its
            own U); None: all U.

    Returns:
        :class:`InformerSample`.
    """
    lq, samples = uniforms.shape
    if causal and lq != lk:
        raise ValueError(f"causal sampling needs Lq == Lk, got Lq={lq}, Lk={lk}")
    _, pad_k = _padding(batch, lq, lk, key_padding_mask, uniforms.device)
    real = ~pad_k
    # (B, Lq): the keys query i may draw (the real keys j <= i when causal)
    allowed = real.long().cumsum(1) if causal else real.sum(1, keepdim=True).expand(batch, lq)
    rank = (uniforms[None] * allowed[..., None]).floor().long()  # (B, Lq, U)
    rank = torch.minimum(rank, (allowed[..., None] - 1).clamp_min(0))
    real_positions = torch.sort(pad_k.to(torch.int8), dim=1, stable=True).indices  # (B, Lk)
    index = real_positions.gather(1, rank.reshape(batch, lq * samples)).view(batch, lq, samples)
    valid = allowed > 0
    if num_samples is not None:
        num_samples = num_samples.to(device=uniforms.device, dtype=torch.long)
        if num_samples.shape != (batch,) or bool(
            ((num_samples < 1) | (num_samples > samples)).any()
        ):
            raise ValueError(f"num_samples must be (B,) = ({batch},) ints in [1, {samples}]")
    return InformerSample(index.masked_fill(~valid[..., None], 0), valid, num_samples)


def _used(sample: InformerSample) -> Tensor:
    """Bool ``(B, 1, U)``: the sample columns each example uses."""
    b, _, samples = sample.keys.shape
    if sample.num_samples is None:
        return torch.ones(b, 1, samples, dtype=torch.bool, device=sample.keys.device)
    columns = torch.arange(samples, device=sample.keys.device)
    return columns < sample.num_samples.to(sample.keys.device).view(b, 1, 1)


def informer_sparsity(
    q: Tensor,
    k: Tensor,
    sample: InformerSample,
    *,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """``M̄(q_i) = max_j s_ij − mean_j s_ij`` over the sampled keys (Zhou et al. 2021 eq. 4
    on the sample), −∞ for padded queries and queries with no sample: ``(B, H, Lq)``,
    O(Lq·U·D), no gradient."""
    b, h, lq, d = q.shape
    lk, samples = k.shape[2], sample.keys.shape[-1]
    scale = d**-0.5 if scale is None else scale
    acc = accumulation_dtype(q.dtype)
    pad_q, pad_k = _padding(b, lq, lk, key_padding_mask, q.device)
    with torch.no_grad():
        xq = q.to(acc).masked_fill(pad_q[:, None, :, None], 0.0)
        xk = k.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
        index = sample.keys.reshape(b, 1, lq * samples, 1).expand(b, h, lq * samples, d)
        ks = xk.gather(2, index).view(b, h, lq, samples, d)
        s = torch.einsum("bhld,bhlud->bhlu", xq, ks) * scale  # (B, H, Lq, U)
        used = _used(sample)[:, None]  # (B, 1, 1, U)
        count = used.sum(-1).to(s.dtype)
        measure = s.masked_fill(~used, -math.inf).amax(-1) - (s * used).sum(-1) / count
        drop = (~sample.valid | pad_q)[:, None, :]
        return measure.masked_fill(drop, -math.inf)


def _top_queries(measure: Tensor, num_top: int | Tensor) -> tuple[Tensor, Tensor]:
    """The queries of largest measure, ties to the earlier position, ``(B, H, u)`` for the
    largest u, and which of them are chosen ``(B, 1, u)`` (the first ``num_top`` of each
    example: an int, or ``(B,)`` per example; clamped to Lq)."""
    b, lq = measure.shape[0], measure.shape[-1]
    if isinstance(num_top, Tensor):
        counts = num_top.to(device=measure.device, dtype=torch.long).clamp(1, lq).view(b, 1, 1)
        most = int(counts.max()) if b else 1
    else:
        positive_int("num_top", num_top)
        most = min(num_top, lq)
        counts = torch.full((b, 1, 1), most, dtype=torch.long, device=measure.device)
    top = torch.sort(measure, dim=-1, descending=True, stable=True).indices[..., :most]
    return top, torch.arange(most, device=measure.device) < counts


def _masked_softmax_v(scores: Tensor, allowed: Tensor, v: Tensor) -> Tensor:
    """softmax over the allowed entries of each row, times v; rows with none give 0."""
    scores = scores.masked_fill(~allowed, -math.inf)
    m = scores.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    z = p.sum(-1, keepdim=True)
    return (p @ v) / torch.where(z > 0, z, torch.ones_like(z))


def _inputs(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """q, k, v in the accumulation dtype with padded rows zeroed, and the two masks."""
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    acc = accumulation_dtype(v.dtype)
    pad_q, pad_k = _padding(b, lq, lk, key_padding_mask, q.device)
    xq = q.to(acc).masked_fill(pad_q[:, None, :, None], 0.0)
    xk = k.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    xv = v.to(acc).masked_fill(pad_k[:, None, :, None], 0.0)
    return xq, xk, xv, pad_q, pad_k


def informer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sample: InformerSample,
    *,
    num_top: int | Tensor,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """ProbSparse attention (see the module docstring): exact softmax for the ``num_top``
    queries of largest :func:`informer_sparsity`, the mean of V (cumulative when ``causal``)
    for the others. O((Lq·U + u·Lk)·D + Lk·Dv) time and memory.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        sample: the keys sampled per query (:func:`informer_sample`, with the same
            ``causal`` and mask).
        num_top: u, the exact queries (clamped to Lq): an int, or ``(B,)`` per example.
        causal: the masked form (needs Lq == Lk).
        key_padding_mask: ``(B, Lk)`` bool, True marks padding.
        scale: logit scale, default ``1/√D``.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of v.
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    scale = d**-0.5 if scale is None else scale
    xq, xk, xv, _, pad_k = _inputs(q, k, v, key_padding_mask)
    measure = informer_sparsity(q, k, sample, key_padding_mask=key_padding_mask, scale=scale)
    top, chosen = _top_queries(measure, num_top)  # (B, H, u), (B, 1, u)
    q_top = xq.gather(2, top[..., None].expand(-1, -1, -1, d))  # (B, H, u, D)
    allowed = ~pad_k[:, None, None, :]  # (B, 1, 1, Lk)
    if causal:
        allowed = allowed & (torch.arange(lk, device=q.device) <= top[..., None])
    out_top = _masked_softmax_v(scale * q_top @ xk.transpose(-1, -2), allowed, xv)
    real = (~pad_k).to(xv.dtype)[:, None, :, None]  # (B, 1, Lk, 1)
    if causal:
        lazy = xv.cumsum(2) / real.cumsum(2).clamp_min(1.0)  # (B, H, L, Dv)
    else:
        lazy = xv.sum(2, keepdim=True) / real.sum(2, keepdim=True).clamp_min(1.0)
        lazy = lazy.expand(b, h, lq, dv).contiguous()
    index = top[..., None].expand(-1, -1, -1, dv)
    out_top = torch.where(chosen[..., None], out_top, lazy.gather(2, index))
    out = lazy.scatter(2, index, out_top)
    return out.to(v.dtype)


def informer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sample: InformerSample,
    *,
    num_top: int | Tensor,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The dense form of :func:`informer_attention` for the same sample: the full
    ``(Lq, Lk)`` score matrix, M̄ from the sampled entries (a count matrix, duplicates
    counted), the same top-u queries, full (masked) softmax for them and a dense averaging
    matrix for the others. O(Lq·Lk) memory. Args and returns as :func:`informer_attention`."""
    b, h, lq, d = q.shape
    lk, samples = k.shape[2], sample.keys.shape[-1]
    scale = d**-0.5 if scale is None else scale
    xq, xk, xv, pad_q, pad_k = _inputs(q, k, v, key_padding_mask)
    scores = scale * xq @ xk.transpose(-1, -2)  # (B, H, Lq, Lk)
    counts = torch.zeros(b, lq, lk, dtype=scores.dtype, device=q.device)
    used = _used(sample).expand(b, lq, samples).to(scores.dtype)
    counts.scatter_add_(2, sample.keys, used)
    counts = counts * sample.valid[..., None]
    s = scores.detach()
    measure = s.masked_fill(counts[:, None] == 0, -math.inf).amax(-1)
    measure = measure - (counts[:, None] * s).sum(-1) / used.sum(-1)[:, None]
    measure = measure.masked_fill((~sample.valid | pad_q)[:, None, :], -math.inf)
    top, chosen = _top_queries(measure, num_top)
    selected = torch.zeros(b, h, lq, dtype=torch.bool, device=q.device)
    selected.scatter_(2, top, chosen.expand_as(top))
    allowed = (~pad_k)[:, None, None, :].expand(b, 1, lq, lk)
    if causal:
        allowed = allowed & torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
    exact = _masked_softmax_v(scores, allowed, xv)
    average = allowed.to(xv.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1)
    lazy = average @ xv
    return torch.where(selected[..., None], exact, lazy).to(v.dtype)
