"""LSH attention of the Reformer (Kitaev, Kaiser and Levskaya, "Reformer: The Efficient
Transformer", ICLR 2020, §2 and App. A).

Angular LSH (§2, after Andoni et al. 2015): with a random ``(D, nb/2)`` matrix R per round,
``h(x) = argmax([xR; −xR])`` puts x in one of ``nb`` buckets. Each round r sorts the tokens by
(bucket, position), cuts the sorted order into chunks of ``m = bucket_size`` positions, and
query i may read the keys of its own chunk and of the chunk before it (the paper's
``P̃_i = {j : ⌊s_i/m⌋ − 1 ≤ ⌊s_j/m⌋ ≤ ⌊s_i/m⌋}``, s the sorted slot), i.e. ``P_i^(r)``:

- ``attend_across_buckets=True`` (trax's LSHSelfAttention, HF ``transformers``,
  reformer-pytorch's default): every key of those chunks counts; False: only keys of query
  i's bucket (the paper's ``P_i = {j : h(q_i) = h(k_j)}`` intersected with the chunks);
- causal: kattn's causal form below replaces the chunks;
- never i itself (``j ≠ i``, §2 "Causal masking for shared-QK attention"), except that a
  token whose pattern is empty in every round reads its own value alone (the first token of a
  causal sequence);
- positions marked by ``key_padding_mask`` are sorted after every real position (as if in a
  last bucket of their own, as HF does), so that the real tokens' chunks do not depend on
  them; they count nowhere and, as queries, read nothing (their output is zero).

The rounds are combined as one softmax over the union ``P_i = ∪_r P_i^(r)`` in which a key
found in several rounds counts once: the paper's multi-round correction (§2, App. A)
subtracts ``log N_ij``, ``N_ij = |{r : j ∈ P_i^(r)}|``, from the logits of each round and
weights the rounds by ``exp(lse_r − lse)``; the fast path instead drops from round r the keys
that an earlier round already holds, which makes the rounds disjoint parts of the same union
(the same result).
reformer-pytorch counts such a key once per round by default (``allow_duplicate_attention``),
and it and trax let the first chunk of a round look back into the last chunk of the previous
round (their chunks roll over the concatenated rounds); here the first chunk of each round
reads only itself, as the definition above says.

The number of buckets is that of the rotations (``nb = 2·R.shape[-1]``), or the product of
``bucket_factors`` (one hash per factor, as trax's and HF's factorized ``n_buckets``). As in
the paper and trax it is fixed per model, so that a token's bucket depends only on that
token: the module (:class:`kattn.attention.reformer.ReformerAttention`) takes
``num_buckets``, by default ``2·⌈max_len/m⌉`` (:func:`reformer_num_buckets`, from the paper's
``m = 2l/n_buckets``: average bucket ``m/2``, so that a bucket rarely outgrows two chunks),
factorized in two beyond HF's limit (:func:`kattn.functional.lsh.reformer_bucket_factors`);
HF rounds the same ratio down to a power of two, reformer-pytorch uses ``L/bucket_size``
buckets. With nb fixed, the real tokens' (bucket, position) order, hence their chunks, does
not depend on padding (sorted after them) nor, in the causal form, on later tokens.

With ``shared_qk=True`` (the paper's Shared-QK Transformer) the keys are ``q_j/‖q_j‖`` and
queries and keys share one sorted order; with ``shared_qk=False`` (kattn's extension) q and k
are hashed with the same rotations and sorted separately, and query chunk n reads key chunks
n − 1 and n.

Causal form (kattn's, not the paper's): the paper's and trax's causal attention masks
``j > i`` inside the chunks, so no later key or value is read, but which earlier keys share a
query's chunks depends on the sort of the whole sequence, later tokens' buckets included.
Here, in each round, query i reads the ``W = 2m − 1`` most recent keys ``j < i`` of its own
bucket ``h(q_i)`` (fewer if the bucket has fewer): a sliding window in the sorted order
restricted to one bucket, whose order inside a bucket is position order, so the set depends
only on tokens ``≤ i``. ``W = 2m − 1`` mirrors "own chunk and the chunk before" of the
non-causal form. Keys of other buckets never count (``attend_across_buckets`` concerns the
non-causal form only), the rounds are merged and the self rule applied as above, and padded
positions read and count nowhere. The fast path cuts the real queries, in sorted order,
into blocks of at most m whose keys all lie in three consecutive key chunks
(:func:`kattn.functional.reformer_patterns.causal_layout`).

Shapes: B batch, H heads, L length, D head dim, Dv value dim, R rounds, nb buckets, m the
chunk length, nc = ⌈L/m⌉ chunks per round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..checks import positive_int
from .lsh import (
    dense_rank,
    lsh_buckets,
    reformer_bucket_factors,
    reformer_num_buckets,
    sorted_order,
)
from .numerics import accumulation_dtype, autocast_off, zero_padded
from .reformer_chunks import ChunkAttention, ChunkPlan, inverse_norms
from .reformer_patterns import ChunkRules, DenseRules, causal_layout

__all__ = [
    "lsh_buckets",
    "reformer_attention",
    "reformer_attention_reference",
    "reformer_bucket_factors",
    "reformer_num_buckets",
]


def reformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotations: Tensor,
    *,
    bucket_size: int = 64,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    shared_qk: bool = True,
    attend_across_buckets: bool = True,
    scale: float | None = None,
    bucket_factors: Sequence[int] | None = None,
) -> Tensor:
    """Multi-round LSH attention (module docstring), in O(R·(L·log L + L·n·D +
    L·m·(D + Dv))) time and O(R·L·m + L·(D + Dv)) memory (when a gradient is wanted, a float
    per score kept for the backward, and in the causal form a bool per score; one round's
    sorted rows).

    Per round: hash, argsort by bucket and position (padded positions last), gather q, k and
    v once into the sorted order, and attend from each chunk to ``[previous chunk, own
    chunk]`` (a strided view of the sorted keys); the per-token rules are applied to each
    group of chunks' logits from per-slot values (the sorted positions, their chunks in the
    earlier rounds). Each round's outputs go back to their original positions and
    are merged with the earlier rounds' by log-sum-exp; the backward rescales each chunk's
    kept probabilities to the merged log-sum-exp and adds the gradients into the unsorted
    rows. With ``shared_qk`` the unit keys are made from each slice's gathered rows of q.

    Args:
        q: ``(B, H, L, D)``; k: ``(B, H, L, D)`` (not read when ``shared_qk``);
            v: ``(B, H, L, Dv)``.
        rotations: ``(H or 1, D, R, Σ f_i/2)``, the random projections of the R rounds.
        bucket_size: m, positions per chunk of the sorted order.
        causal: the causal form (module docstring): the ``2m − 1`` most recent earlier keys
            of the query's bucket, each round.
        key_padding_mask: ``(B, L)`` bool, True marks padding.
        shared_qk: keys are ``q/‖q‖`` (k is not read) when True.
        attend_across_buckets: whether keys of another bucket in the two chunks count (the
            non-causal form only).
        scale: logit scale, default ``1/√D``.
        bucket_factors: the factors ``f_i`` of nb, one hash each (trax's hierarchical
            hashing, :func:`kattn.functional.lsh.lsh_buckets`); None: one hash of
            ``nb = 2·R.shape[-1]`` buckets.

    Returns:
        ``(B, H, L, Dv)`` in the dtype of q.
    """
    m, across = positive_int("bucket_size", bucket_size), attend_across_buckets
    b, _, length, d = q.shape
    if k.shape[:3] != q.shape[:3] or v.shape[:3] != q.shape[:3] or k.shape[-1] != d:
        raise ValueError(
            "reformer_attention needs q, k (B, H, L, D) and v (B, H, L, Dv) of one length, got "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    pad = _padding(key_padding_mask, b, length, q.device)
    if q.numel() == 0 or v.numel() == 0:  # nothing to sort: the empty output, in the graph
        return (q[..., :1] + k[..., :1]) * v * 0
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    with autocast_off(q):
        hashes_q = lsh_buckets(q, rotations, bucket_factors)  # (B, H, R, L)
        hashes_k = hashes_q if shared_qk else lsh_buckets(k, rotations, bucket_factors)
        lp = -(-length // m) * m  # whole chunks
        order_q = sorted_order(hashes_q, pad, lp)  # (B, H, R, Lp), filler slots: 0
        order_k = order_q if shared_qk else sorted_order(hashes_k, pad, lp)
        q, k, v = zero_padded(key_padding_mask, q, k, v)  # no NaN stored there gets through
        if shared_qk:
            k = q  # the keys are q's own rows: the chunked pass gathers them once
        if causal:  # the same-bucket sliding window, blocks reading three key chunks
            blocks, starts, allowed = causal_layout(order_q, order_k, hashes_q, hashes_k, pad, m)
            rules: ChunkRules | DenseRules = DenseRules(allowed)
            del allowed  # the rules keep their own (negated) copy
            plan = ChunkPlan(blocks, order_k, rules, length, m, scale, starts)
        else:
            rules = ChunkRules(order_q, order_k, hashes_q, hashes_k, pad, m, across, acc)
            plan = ChunkPlan(order_q, order_k, rules, length, m, scale, same_order=shared_qk)
        q_, v_ = q.to(acc), v.to(acc)
        k_ = q_ if k is q else k.to(acc)
        if not torch.is_grad_enabled():  # no graph: the pass keeps nothing for a backward
            q_, v_ = q_.detach(), v_.detach()
            k_ = q_ if k is q else k_.detach()
        out, lse = ChunkAttention.apply(  # (B, H, L, Dv), (B, H, L): the rounds merged
            q_,
            k_,
            v_,
            plan,
            shared_qk,  # shared: the keys are k's rows made unit rows
        )
        empty = torch.isinf(lse).nonzero(as_tuple=True)
        if empty[0].numel():  # no round reads a key (e.g. the first causal token): own value
            out = out.index_put(empty, v[empty].to(out.dtype))
    return out.to(q.dtype)


def reformer_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotations: Tensor,
    *,
    bucket_size: int = 64,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    shared_qk: bool = True,
    attend_across_buckets: bool = True,
    scale: float | None = None,
    bucket_factors: Sequence[int] | None = None,
) -> Tensor:
    """The same attention (same arguments, same hashes) from the definition, in O(R·L²)
    time and memory: each round's sorted slot of position i counted as the number of tokens
    before it in (padding, bucket, position) order, its dense ``(L, L)`` pattern ``P^(r)``
    (causal: the pairs of one bucket with ``j < i`` and at most ``2m − 1`` real keys of the
    bucket in ``j … i − 1``, counted by prefix sums, independently of any chunking),
    ``N_ij`` the number of rounds holding (i, j), one masked softmax per round of the logits
    minus ``log N_ij`` (the paper's App. A), the rounds weighted by ``exp(lse_r − lse)``, and
    ``v_i`` itself where no round holds a key."""
    m = positive_int("bucket_size", bucket_size)
    b, _, length, d = q.shape
    pad = _padding(key_padding_mask, b, length, q.device)
    acc = accumulation_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    q_, k_, v_ = q.to(acc), k.to(acc), v.to(acc).masked_fill(pad[:, None, :, None], 0.0)
    if shared_qk:
        k_ = _unit(q_)
    k_ = k_.masked_fill(pad[:, None, :, None], 0.0)
    hq = lsh_buckets(q, rotations, bucket_factors)
    hk = hq if shared_qk else lsh_buckets(k, rotations, bucket_factors)
    if causal:
        held = _causal_pattern(hq, hk, pad, 2 * m - 1)
    else:
        cq = dense_rank(hq, pad) // m  # (B, H, R, L): the chunk of each query, each round
        ck = dense_rank(hk, pad) // m
        i = torch.arange(length, device=q.device)
        ci, cj = cq[..., :, None], ck[..., None, :]
        held = (cj <= ci) & (cj >= ci - 1)  # (B, H, R, L, L)
        if not attend_across_buckets:
            held &= hq[..., :, None] == hk[..., None, :]
        held &= (i[None, :] != i[:, None]) & ~pad[:, None, None, None, :]
        held &= ~pad[:, None, None, :, None]  # padded queries read nothing
    count = held.sum(dim=2, keepdim=True)  # N_ij
    logits = torch.einsum("bhid,bhjd->bhij", q_, k_)[:, :, None] * scale
    logits = logits - torch.log(count.clamp_min(1).to(acc))
    logits = logits.masked_fill(~held, -math.inf)
    lse = torch.logsumexp(logits, dim=-1)  # (B, H, R, L)
    total = torch.logsumexp(lse, dim=2, keepdim=True)
    finite = torch.isfinite(total)
    weights = torch.exp(logits - torch.where(finite, total, 0.0)[..., None])
    out = torch.einsum("bhrij,bhjd->bhid", weights.nan_to_num(0.0), v_)
    out = torch.where(finite.squeeze(2)[..., None], out, v_)
    return out.to(q.dtype)


# ------------------------------------------------------------------------------- helpers
def _causal_pattern(hq: Tensor, hk: Tensor, pad: Tensor, window: int) -> Tensor:
    """The causal form pair by pair, ``(B, H, R, L, L)``: query i (not padded) holds key j
    when ``j < i``, j is not padded, ``h(q_i) = h(k_j)`` and at most ``window`` real keys of
    that bucket lie in positions ``j … i − 1`` (counted with an exclusive prefix sum)."""
    length = hk.shape[-1]
    real = ~pad[:, None, None, :]
    nb = int(torch.maximum(hq.max(), hk.max())) + 1 if hk.numel() else 1
    member = torch.nn.functional.one_hot(hk, nb) * real[..., None]  # (B, H, R, L, nb)
    before = (member.cumsum(dim=3) - member).transpose(-1, -2)  # [b, x]: real keys of b < x
    at = before.gather(3, hq[..., None].expand(*hq.shape, length))  # [i, j]: C_{h(q_i)}(j)
    count = at.diagonal(dim1=-2, dim2=-1)[..., None] - at  # real keys of h(q_i) in [j, i)
    i = torch.arange(length, device=hq.device)
    held = (hq[..., :, None] == hk[..., None, :]) & (i[None, :] < i[:, None])
    return held & (count <= window) & real[..., None, :] & real[..., :, None]


def _padding(key_padding_mask: Tensor | None, b: int, length: int, device: torch.device) -> Tensor:
    if key_padding_mask is None:
        return torch.zeros(b, length, dtype=torch.bool, device=device)
    if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (b, length):
        raise ValueError(
            f"key_padding_mask must be a (B, L) = {(b, length)} bool tensor, got shape "
            f"{tuple(key_padding_mask.shape)} and dtype {key_padding_mask.dtype}"
        )
    return key_padding_mask


def _unit(x: Tensor) -> Tensor:
    """``x/‖x‖`` over the last dim (a zero vector stays zero, with a zero gradient)."""
    return x * inverse_norms(x)
