"""The chunked pass of Reformer LSH attention (Kitaev, Kaiser and Levskaya, "Reformer: The
Efficient Transformer", ICLR 2020, §2 and App. A): the softmax of each block of sorted query
slots over its window of key chunks, the rounds merged into one softmax over the union of
their (disjoint) key sets, with a backward that reads the probabilities the forward kept
(:class:`ChunkAttention` on a :class:`ChunkPlan`). Which slots may be read comes from
the rules of :mod:`kattn.functional.reformer_patterns`, applied to each group's logits.
Used by :func:`kattn.functional.reformer_attention`.

A slice of (batch, head) sequences at a time, round by round, q, k and v are gathered once
into the sorted order; a block's keys are then a window of consecutive key chunks: a
strided view of the sorted keys when every block reads the chunk before it and its own (the
non-causal form, no copy), otherwise its ``span`` chunks gathered whole. The slice's outputs
(and in the backward its gradients) go back to the original positions by gathering with the
inverse orders, and the rounds are merged by their log-sum-exp as they arrive, so beyond
the kept probabilities (and the causal form's per-score masks) only O(L·(D + Dv)) is held.

Shapes: B batch, H heads, L length, D head dim, Dv value dim, R rounds, m the chunk length,
NB blocks of m query slots per (batch, head, round), Lq = NB·m, S = span·m key slots per block.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .lsh import slots
from .reformer_patterns import MASKED, ChunkRules, DenseRules

__all__ = ["ChunkAttention", "ChunkPlan", "inverse_norms"]

#: score elements computed at once (the blocks are processed in groups of about this size).
_CHUNK_ELEMENTS = 1 << 20

#: sorted rows gathered at once (whole (batch, head) sequences, at least one).
_SLICE_ROWS = 1 << 14


class ChunkPlan:
    """Row indices and rules for :class:`ChunkAttention`, round by round (leading dim R),
    with the (batch, head) sequences and their blocks flattened.

    Args:
        order_q: ``(B, H, R, Lq)``, the query position of each slot of the NB blocks (filler
            slots: any position, not :attr:`positioned` in the rules).
        order_k: ``(B, H, R, Lp)``, the key positions in sorted order (every position once in
            the first L slots).
        rules: which key slots of its block's window (``rules.window`` = S of them) each query
            slot may read: :class:`~kattn.functional.reformer_patterns.ChunkRules` (the
            non-causal form) or :class:`~kattn.functional.reformer_patterns.DenseRules`.
        length: L.
        m: the chunk length.
        scale: the logit scale.
        starts: ``(B, H, R, NB)``, the first key chunk of each block's window counted from
            ``span − 1`` front filler chunks; None: block n reads key chunks n − 1 and n.
        same_order: ``order_k`` is ``order_q`` (shared QK, consecutive windows only).
    """

    def __init__(
        self,
        order_q: Tensor,
        order_k: Tensor,
        rules: ChunkRules | DenseRules,
        length: int,
        m: int,
        scale: float,
        starts: Tensor | None = None,
        *,
        same_order: bool = False,
    ) -> None:
        b, h, rounds, lq = order_q.shape
        nblocks, span = lq // m, rules.window // m
        device = order_q.device
        self.shape, self.length, self.m, self.scale = (b, h, rounds), length, m, scale
        self.span, self.nblocks, self.lq = span, nblocks, lq
        self.consecutive = starts is None
        #: keys sorted as the queries (``order_k`` is ``order_q``, shared QK): a slice's key
        #: rows are its query rows after the front chunk
        self.same_order = same_order and self.consecutive
        if self.consecutive and span != 2:
            raise ValueError(f"consecutive windows read two chunks, got a span of {span}")
        seq = torch.arange(b * h, device=device).view(b, h, 1, 1)  # the (b, h) sequence

        def by_round(x: Tensor) -> Tensor:  # (B, H, R, …) → (R, B·H·…)
            return x.movedim(2, 0).reshape(rounds, -1)

        self.rows_q = by_round(order_q + seq * length)  # (R, B·H·Lq): rows of (B·H·L, ·)
        #: the rules (None in the copy a backward keeps, :meth:`without_rules`)
        self.rules: ChunkRules | DenseRules | None = rules
        #: the logits of a round, (R, B·H·NB, m, S)
        self.score_shape = (rounds, b * h * nblocks, m, span * m)
        if self.consecutive:  # keys as sorted; one front filler chunk per slice
            keys, first_key = order_k, m
        else:  # per sequence: span − 1 filler chunks, the keys, one filler chunk
            front = order_k.new_zeros(b, h, rounds, (span - 1) * m)
            keys = torch.cat([front, order_k, order_k.new_zeros(b, h, rounds, m)], dim=-1)
            first_key = (span - 1) * m
        self.lk = keys.shape[-1]  # key rows per sequence
        self.rows_k = by_round(keys + seq * length)  # (R, B·H·Lk)
        if starts is None:
            self.chunks = None
        else:  # the key chunks of each block's window, counted in the rows of rows_k
            first = by_round(starts + seq * (self.lk // m))
            self.chunks = (first[..., None] + torch.arange(span, device=device)).contiguous()
        # the inverse orders: each position's query slot (−1: none) and key row
        slot = torch.arange(b * h * lq, device=device).expand(rounds, -1)
        dest = torch.where(rules.positioned, self.rows_q, b * h * length)
        inverse = torch.full((rounds, b * h * length + 1), -1, device=device, dtype=torch.long)
        self.inverse_q = inverse.scatter_(1, dest, slot)[:, :-1]  # (R, B·H·L)
        self.inverse_k = by_round(slots(order_k, length) + first_key + seq * self.lk)
        per_slice = max(1, _SLICE_ROWS // max(lq, self.lk))
        self.slices = [(s0, min(b * h, s0 + per_slice)) for s0 in range(0, b * h, per_slice)]
        self.step = max(1, _CHUNK_ELEMENTS // (m * span * m))

    def without_rules(self) -> ChunkPlan:
        """A copy sharing every index but holding no rules (``rules`` None), for a backward
        that reads the kept probabilities."""
        plan = copy.copy(self)
        plan.rules = None
        return plan

    def slice(self, r: int, s0: int, s1: int) -> _Slice:
        """Round r's sequences s0..s1 (of the B·H)."""
        return _Slice(self, r, s0, s1)


class _Slice:
    """One round's (batch, head) sequences s0..s1: their sorted rows, inverse orders (local to
    the slice's buffers), rules and groups of blocks."""

    def __init__(self, plan: ChunkPlan, r: int, s0: int, s1: int) -> None:
        m, length, lq, lk = plan.m, plan.length, plan.lq, plan.lk
        self.m, self.span, self.consecutive = m, plan.span, plan.consecutive
        self.positions = slice(s0 * length, s1 * length)
        self.rows_q = plan.rows_q[r, s0 * lq : s1 * lq]
        self.rows_k = plan.rows_k[r, s0 * lk : s1 * lk]
        inverse = plan.inverse_q[r, self.positions]  # the last row of a slice's outputs: 0
        self.inverse_q = torch.where(inverse < 0, (s1 - s0) * lq, inverse - s0 * lq)
        self.inverse_k = plan.inverse_k[r, self.positions] - s0 * lk
        b0, b1 = s0 * plan.nblocks, s1 * plan.nblocks
        self.blocks = slice(b0, b1)  # the slice's blocks among the round's B·H·NB
        self.rules = None if plan.rules is None else plan.rules.at(r, s0, s1)
        self.chunks = None if plan.chunks is None else plan.chunks[r, b0:b1] - s0 * (lk // m)
        self.groups = [(c0, min(b1 - b0, c0 + plan.step)) for c0 in range(0, b1 - b0, plan.step)]

    def keys(self, x: Tensor) -> Tensor:
        """The slice's sorted rows of x, ``(rows, ·)``: after one zero front chunk
        (consecutive windows), or with each sequence's filler chunks."""
        if not self.consecutive:
            return x.index_select(0, self.rows_k)
        out = x.new_empty(self.m + self.rows_k.numel(), x.shape[-1])
        out[: self.m].zero_()
        torch.index_select(x, 0, self.rows_k, out=out[self.m :])
        return out

    def scaled_keys(
        self, x: Tensor, scale: float, unit: bool, gathered: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`keys` times the logit scale, each row made a unit row first when ``unit``:
        ``(keys, factor)``, factor ``scale/‖row‖`` per row (None when not ``unit``), the
        multiplier the backward applies again. ``gathered``: the same rows already gathered
        (keys sorted as the queries, :attr:`ChunkPlan.same_order`), read instead of gathered
        again, the keys made from them in one pass."""
        if gathered is None:
            keys = self.keys(x)
            rows = keys[self.m :] if self.consecutive else keys
        else:  # consecutive windows: one zero front chunk, then the scaled rows
            keys = x.new_empty(self.m + gathered.shape[0], x.shape[-1])
            keys[: self.m].zero_()
            rows = keys[self.m :]
        source = rows if gathered is None else gathered
        if not unit:
            torch.mul(source, scale, out=rows)
            return keys, None
        factor = inverse_norms(source, scale)  # 0 for a zero row: it stays zero
        torch.mul(source, factor, out=rows)
        return keys, factor

    def key_grad_buffer(self, sorted_keys: Tensor) -> Tensor:
        """The buffer :meth:`add_window` fills, shaped as :meth:`keys`' rows: zeros, or with
        consecutive windows (which write each own chunk before adding to it) only the front
        chunk zeroed."""
        if not self.consecutive:
            return torch.zeros_like(sorted_keys)
        grad = torch.empty_like(sorted_keys)
        grad[: self.m].zero_()
        return grad

    def window(self, sorted_keys: Tensor, c0: int, c1: int) -> Tensor:
        """The windows of blocks c0..c1 in the sorted keys (:meth:`keys`), ``(c, S, ·)``."""
        m, s, d = self.m, self.span * self.m, sorted_keys.shape[-1]
        if self.chunks is None:  # overlapping strided views, no copy
            return sorted_keys[c0 * m :].as_strided((c1 - c0, s, d), (m * d, d, 1))
        chunks = sorted_keys.view(-1, m * d)
        return chunks.index_select(0, self.chunks[c0:c1].flatten()).view(c1 - c0, s, d)

    def add_window(self, grad: Tensor, pair: tuple[Tensor, Tensor], c0: int, c1: int) -> None:
        """``grad[window rows] += a·b`` for blocks c0..c1, ``pair = (a (c, S, m), b (c, m, ·))``
        (a's rows: the window's key slots; grad from :meth:`key_grad_buffer`)."""
        a, b_ = pair
        m, d = self.m, grad.shape[-1]
        if self.chunks is None:  # the own chunk (one later), then the chunk before
            # the own chunks are written, not added: no earlier group reached them, and the
            # chunk before each block is the own chunk of the block before, written already
            torch.bmm(a[:, m:], b_, out=grad[(c0 + 1) * m : (c1 + 1) * m].view(-1, m, d))
            grad[c0 * m : c1 * m].view(-1, m, d).baddbmm_(a[:, :m], b_)
            return
        win = torch.bmm(a, b_).view(-1, m * d)
        grad.view(-1, m * d).index_add_(0, self.chunks[c0:c1].flatten(), win)


class ChunkAttention(torch.autograd.Function):
    """Softmax attention of each block of sorted query slots over its window, every round,
    merged over the rounds: ``out (B, H, L, Dv)`` and ``lse (B, H, L)`` (not
    differentiable; −∞ and a zero output for a query that reads no key in any round). The
    rounds' key sets are disjoint parts of one union (the plan's rules keep a key in its
    first round only), so the merged output is one softmax over the union. With
    ``unit_keys`` the keys are ``k_j/‖k_j‖`` (the Shared-QK Transformer's, k = q), made from
    each slice's gathered rows and differentiated there, so no normalised copy of k exists.

    When a gradient is wanted, the forward keeps each block's probabilities (one float per
    score, R·B·H·NB·m·S in all) and each slot's log-sum-exp ``lse_r`` in its round; the
    backward rescales them by ``exp(lse_r − lse)`` with the merged lse instead of recomputing
    the scores, and keeps no mask."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan, unit_keys: bool) -> Any:
        (b, h, rounds), length, m = plan.shape, plan.length, plan.m
        d, dv = q.shape[-1], v.shape[-1]
        qf, kf, vf = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, dv)
        out, lse = q.new_empty(b * h * length, dv), q.new_empty(b * h * length)
        keep = any(ctx.needs_input_grad[:3])
        shared_rows = k is q and plan.same_order  # one gather serves queries and keys
        if keep:  # what the backward reads instead of recomputing the scores
            probs = q.new_empty(plan.score_shape)  # (R, B·H·NB, m, S)
            lses = q.new_empty(rounds, b * h * plan.lq)
        scratch = q.new_empty(plan.step * plan.score_shape[2] * plan.score_shape[3])
        for s0, s1 in plan.slices:  # a slice's rounds one after the other: its rows stay cached
            for r in range(rounds):
                sl = plan.slice(r, s0, s1)
                assert sl.rules is not None
                qs = qf.index_select(0, sl.rows_q)  # the logit scale goes on the keys
                ks, _ = sl.scaled_keys(kf, plan.scale, unit_keys, qs if shared_rows else None)
                vs = sl.keys(vf)
                os_ = q.new_empty(qs.shape[0] + 1, dv)  # the last row: positions read nothing
                lse_s = q.new_empty(qs.shape[0] + 1)
                os_[-1], lse_s[-1] = 0.0, -math.inf
                for c0, c1 in sl.groups:
                    qg = qs[c0 * m : c1 * m].view(-1, m, d)
                    scores = torch.bmm(qg, sl.window(ks, c0, c1).mT)
                    sl.rules.apply(scores, c0, c1, scratch)
                    top = scores.amax(dim=-1, keepdim=True)
                    # a slot reads no key when its largest logit is a disallowed one (or its
                    # rules say so): its lse is −∞ (its output row, finite, then weighs 0)
                    rows = slice(c0 * m, c1 * m)
                    dead = top.flatten() < MASKED / 2
                    if sl.rules.reads is not None:
                        dead |= ~sl.rules.reads[rows]
                    # one fused pass per row (max, exp, sum, scale) instead of four over the
                    # group; the largest probability is exp(top − lse), which gives the lse
                    p = _softmax(scores, probs[r, sl.blocks][c0:c1] if keep else scores)
                    torch.bmm(p, sl.window(vs, c0, c1), out=os_[rows].view(-1, m, dv))
                    lse_s[rows] = top.sub_(p.amax(dim=-1, keepdim=True).log_()).flatten()
                    lse_s[rows].masked_fill_(dead, -math.inf)
                    if keep:
                        lses[r, sl.blocks.start * m :][rows] = lse_s[rows]
                at = sl.positions
                if r == 0:
                    torch.index_select(os_, 0, sl.inverse_q, out=out[at])
                    torch.index_select(lse_s, 0, sl.inverse_q, out=lse[at])
                else:
                    _merge(out[at], lse[at], os_.index_select(0, sl.inverse_q), lse_s[sl.inverse_q])
        out, lse = out.view(b, h, length, dv), lse.view(b, h, length)
        if keep:  # the probabilities say all the backward needs of the mask
            ctx.save_for_backward(q, k, v, out, lse, probs, lses)
            ctx.plan, ctx.unit_keys = plan.without_rules(), unit_keys
            ctx.shared_rows = shared_rows
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor, _d_lse: Tensor | None) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, probs, lses = ctx.saved_tensors
        plan: ChunkPlan = ctx.plan
        m, d, dv = plan.m, q.shape[-1], v.shape[-1]
        qf, kf, vf = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, dv)
        dof = d_out.reshape(-1, dv)
        delta = (d_out * out).sum(dim=-1).flatten()  # rowsum(dO ∘ O)
        lse = lse.flatten().nan_to_num(neginf=0.0)  # a query with no key: p = 0 everywhere
        dq, dvf = torch.empty_like(qf), torch.empty_like(vf)
        dk = None if ctx.shared_rows else torch.empty_like(kf)  # shared: q's rows take both
        for s0, s1 in plan.slices:
            for r in range(plan.shape[2]):
                sl = plan.slice(r, s0, s1)
                rows, b0 = sl.rows_q, sl.blocks.start
                qs = qf.index_select(0, rows)
                ks, factor = sl.scaled_keys(
                    kf, plan.scale, ctx.unit_keys, qs if ctx.shared_rows else None
                )
                # the probabilities of the merged softmax are P·c per query slot, P the round's
                # as kept and c = exp(lse_r − lse) (0 for a slot that read nothing: its lse_r is
                # −∞); c goes on dO and δ, the smaller side of each product:
                # dV = Pᵀ(c·dO), dS = P ∘ ((c·dO)Vᵀ − c·δ)
                c = (lses[r, b0 * m : b0 * m + rows.numel()] - lse[rows]).exp_()
                dos = dof.index_select(0, rows).mul_(c[:, None])
                delta_q = delta[rows].mul_(c)
                vs = sl.keys(vf)
                dqs = qs.new_empty(qs.shape[0] + 1, d)  # the last row: positions read nothing
                dqs[-1] = 0.0
                dks, dvs = sl.key_grad_buffer(ks), sl.key_grad_buffer(vs)
                for c0, c1 in sl.groups:
                    part = slice(c0 * m, c1 * m)
                    qg, dog = qs[part].view(-1, m, d), dos[part].view(-1, m, dv)
                    kw, vw = sl.window(ks, c0, c1), sl.window(vs, c0, c1)
                    p = probs[r, b0 + c0 : b0 + c1]
                    ds = torch.bmm(dog, vw.mT).sub_(delta_q[part].view(-1, m, 1)).mul_(p)
                    torch.bmm(ds, kw, out=dqs[part].view(-1, m, d))
                    sl.add_window(dks, (ds.mT, qg), c0, c1)
                    sl.add_window(dvs, (p.mT, dog), c0, c1)
                # the keys are c·x, c = scale or scale/‖x‖ (unit keys u = x/‖x‖): dx = c·dK, or
                # through u, dx = (dK − u·(u·dK))·scale/‖x‖ with u = K/scale
                if factor is None:
                    dks.mul_(plan.scale)
                else:  # factor: the key rows after the front chunk (consecutive windows)
                    kr, dkr = (ks[m:], dks[m:]) if sl.consecutive else (ks, dks)
                    dot = (kr * dkr).sum(dim=-1, keepdim=True).div_(plan.scale**2)
                    dkr.addcmul_(kr, dot, value=-1.0).mul_(factor)
                if dk is None:  # k is q, sorted alike: add the query rows' part to the key rows
                    dks[m:].add_(dqs[:-1])  # (a slot that read nothing has zero rows in dqs)
                    pairs = [(dq, dks, sl.inverse_k), (dvf, dvs, sl.inverse_k)]
                else:
                    pairs = [
                        (dq, dqs, sl.inverse_q),
                        (dk, dks, sl.inverse_k),
                        (dvf, dvs, sl.inverse_k),
                    ]
                for grad, src, inverse in pairs:
                    if r == 0:
                        torch.index_select(src, 0, inverse, out=grad[sl.positions])
                    else:
                        grad[sl.positions] += src.index_select(0, inverse)
        dk_ = None if dk is None else dk.view_as(k)
        return dq.view_as(q), dk_, dvf.view_as(v), None, None


def _softmax(scores: Tensor, out: Tensor) -> Tensor:
    """The softmax over the last dim of ``scores`` written to ``out`` (which may be
    ``scores``): PyTorch's fused kernel, one row at a time."""
    return torch.ops.aten._softmax.out(scores, -1, False, out=out)


def inverse_norms(x: Tensor, scale: float = 1.0) -> Tensor:
    """``scale/‖x‖`` over the last dim, kept as a dim of size 1 and capped at the dtype's
    largest value; 0 for a zero row. Differentiable. ``x·inverse_norms(x)`` is the unit row,
    and a zero row stays zero with a zero gradient (x/‖x‖ has no derivative at 0; the
    division by a clamped norm would give the row its key's gradient times 1/tiny)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    nonzero = norm > 0
    # the reciprocal of a safe norm: a reciprocal of 0 would give the masked branch an
    # infinite derivative, and 0·∞ a NaN gradient
    inverse = torch.where(nonzero, norm, 1.0).reciprocal().mul(scale)
    return torch.where(nonzero, inverse.clamp_max(torch.finfo(x.dtype).max), 0.0)


def _merge(out: Tensor, lse: Tensor, o_r: Tensor, lse_r: Tensor) -> None:
    """Merge, in place, two softmaxes over disjoint key sets into one: weights
    ``exp(lse_x − lse)`` (−∞: no key), the two summing to one, so one ``lerp`` pass: ``out +
    w·(o_r − out)``, ``w = exp(lse_r − lse)``. A row with no key in either keeps its (finite)
    ``out`` and an lse of −∞, which marks it for the caller."""
    top = torch.maximum(lse, lse_r)
    top = torch.where(torch.isfinite(top), top, 0.0)
    a, c = torch.exp(lse - top), torch.exp(lse_r - top)
    total = a + c
    out.lerp_(o_r, (c / torch.where(total > 0, total, 1.0))[:, None])
    lse.copy_(top + total.log())
