"""Reformer LSH attention (Kitaev, Kaiser and Levskaya, "Reformer: The Efficient Transformer",
ICLR 2020, §2 and App. A): softmax within the chunks of a hash-sorted order, several rounds.

How it differs from the released implementations (read, not copied):

- trax (``LSHSelfAttention``) and reformer-pytorch (``LSHAttention``) let the first chunk of a
  round look back into the last chunk of the previous round (they roll over the concatenated
  rounds); here each round's first chunk reads only itself, as the paper's chunk rule says.
- reformer-pytorch counts a key that two rounds hold once per round by default
  (``allow_duplicate_attention=True``); here it counts once, the paper's App. A correction.
- trax, HF ``transformers`` and reformer-pytorch forbid attending to oneself with a large
  negative logit (−1e5 / −5e4), so a token with nothing else to read gets weight 1 on itself;
  here that rule is exact: the own value is used if and only if no round holds another key.
- reformer-pytorch uses ``L/bucket_size`` buckets and needs L to be a multiple of
  ``2·bucket_size``; HF rounds ``2L/chunk`` down to a power of two. Here, as in the paper and
  trax, the number of buckets is fixed per module (``num_buckets``, or ``2·⌈max_len/m⌉``, the
  paper's ``m = 2l/n_buckets`` at the longest length), so that a token's bucket depends on
  that token alone; any L works (the last chunk may be partial). Beyond HF's limit
  ``2·max(⌊√(max_len/m)⌋, m)`` the default count is hashed as two factors, as HF does (trax's
  hierarchical hashing, a list ``n_buckets``); HF's factors of a power of two are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..checks import boolean, is_positive_int, positive_float_or_none, positive_int
from ..functional.lsh import bucket_factors
from ..functional.reformer import (
    reformer_attention,
    reformer_attention_reference,
    reformer_bucket_factors,
)
from ..registry import register_mechanism
from .base import Attention
from .seeded import SeededDraws


class ReformerAttention(SeededDraws, Attention):
    """LSH attention (Kitaev et al. 2020, §2): per round, angular LSH ``h(x) =
    argmax([xR; −xR])`` with a random Gaussian ``R (D, nb/2)`` per head, a sort by (bucket,
    position), and softmax attention of each chunk of ``bucket_size`` sorted positions over
    itself and the chunk before it; ``num_hashes`` rounds make one softmax over the union, a
    key held by several rounds counted once (App. A). A token never reads itself unless no
    round gives it any other key (then its output is its own value). Positions marked as
    padding are sorted after the real ones and count nowhere. See
    :mod:`kattn.functional.reformer` for the exact pattern. O(R·(L·log L + L·n·D +
    L·m·(D + Dv))) time and O(R·L·(m + D + Dv)) memory, n = Σ f_i/2 rotation columns for
    nb = f_1·f_2⋯ buckets (nb/2 for one hash).

    Number of buckets (the paper's and trax's ``n_buckets``, a hyperparameter of the model):
    ``num_buckets`` if given, else ``nb = 2·⌈max_len/m⌉`` when the module has ``max_len``
    (``kattn.build(..., max_len=...)``, as the models pass it). A list of factors
    ``[f_1, f_2, …]`` gives ``f_1·f_2⋯`` buckets from one hash per factor (trax's
    hierarchical hashing, HF's factorized ``num_buckets``), with ``Σ f_i/2`` rotation columns
    per round instead of ``nb/2``; the default count is so factorized in two beyond HF's
    limit ``2·max(⌊√(max_len/m)⌋, m)`` (:func:`kattn.functional.reformer_bucket_factors`: at
    max_len 16,384 and m = 64, 16·32 buckets from 24 columns instead of 256). The rotations,
    hence every token's bucket, then depend only on that token and the seed, so neither the
    padding a batch adds nor later tokens change the pattern of the real (or earlier) ones: an
    example alone equals the same example right-padded in a longer batch, and a causal prefix run
    equals the full run on the prefix. Only with neither given is nb taken from the length
    of each call, ``2·⌈L/m⌉`` (L the padded length): then, and only then, an output depends
    on the padded length of its batch and, causal, on how many tokens follow it.

    Shared QK (``shared_qk=True``, the paper's setting, §2): **the given k is not read**;
    the keys are ``q_j/‖q_j‖`` and the logits ``q_i·k_j/√D``. k still receives a gradient, of
    zeros (the output does not depend on it). ``shared_qk=False`` (an extension): k is hashed
    with the same rotations as q and sorted on its own, query chunk n reading key chunks
    n − 1 and n; the self rule then concerns key i, the one at query i's position.

    ``attend_across_buckets=True`` (trax, HF and reformer-pytorch): every key in the two
    chunks counts; False: only those of the query's bucket (the paper's ``P_i``). The option
    concerns the non-causal form only.

    Randomness: the rotations follow the seeded contract of :mod:`kattn.attention.seeded`
    (a generator owned by the module, the same for every batch item, fixed in ``eval()`` per
    number of buckets, redrawn per training forward, reused under checkpointing, seed and
    draws in ``state_dict()``).

    Causal (kattn's causal form, not the paper's): the paper's causal chunking masks later
    keys, but which earlier keys share a query's chunk depends on the sort of the whole
    sequence, later tokens included. Here each round a query reads the ``2·bucket_size − 1``
    most recent earlier keys of its own bucket, a sliding window in the sorted order that
    depends on no later token; keys of other buckets never count, rounds and the self rule
    are as above, padded positions read nothing. Cross-attention is not defined (a query's
    keys are those sorted next to it in the same sequence), and there is no recurrent form
    (the sort needs the whole sequence).

    Args:
        bucket_size: m, positions per chunk of the sorted order (the paper's chunk length).
        num_hashes: R, rounds of hashing.
        num_buckets: nb, buckets per round, an even int >= 2 (one hash), or its factors, a
            list of even ints >= 2 or a comma-separated string of them (one hash each); None:
            ``2·⌈max_len/m⌉``, or ``2·⌈L/m⌉`` per call when the module has no ``max_len``,
            factorized in two beyond HF's limit.
        shared_qk: keys are the unit-normalised queries (k not read) when True.
        attend_across_buckets: whether keys of another bucket in the chunks count.
        seed: the seed of the rotations, an int >= 0.
        scale: logit scale, default ``1/√D``.
    """

    is_exact = False
    supports_cross = False
    supports_recurrent = False
    rows_depend_on_other_queries = True  # shared_qk's default
    draw_stream = "reformer"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        bucket_size: int = 64,
        num_hashes: int = 2,
        num_buckets: int | Sequence[int] | str | None = None,
        shared_qk: bool = True,
        attend_across_buckets: bool = True,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            bucket_size=bucket_size,
            num_hashes=num_hashes,
            num_buckets=num_buckets,
            shared_qk=shared_qk,
            attend_across_buckets=attend_across_buckets,
            seed=seed,
            scale=scale,
        )
        self.bucket_size = positive_int("bucket_size", bucket_size)
        self.num_hashes = positive_int("num_hashes", num_hashes)
        self.num_buckets = _num_buckets(num_buckets)
        self.shared_qk = boolean("shared_qk", shared_qk)
        self.attend_across_buckets = boolean("attend_across_buckets", attend_across_buckets)
        self.scale = positive_float_or_none("scale", scale)
        self._init_seeded(seed)
        self._set_capabilities(shared_qk=shared_qk)

    @classmethod
    def capabilities(cls, **options: Any) -> dict[str, bool]:
        """The class flags. In a causal call (the only kind a key/value cache makes: the
        module takes no cross-attention) a query's row depends on the other queries only with
        shared query-key, the keys then being the queries themselves; with separate q and k
        its keys are found from the keys' order alone. (A non-causal row also depends on the
        query's rank among the sorted queries, which chooses its chunk.)"""
        flags = super().capabilities(**options)
        if "shared_qk" in options:
            flags["rows_depend_on_other_queries"] = bool(options["shared_qk"])
        return flags

    # ---------------------------------------------------------------------------- rotations
    def bucket_factors(self, length: int) -> tuple[int, ...]:
        """The factors of the number of buckets for a call on ``length`` (padded) tokens, one
        hash each: ``num_buckets``, else those of ``2·⌈max_len/m⌉``, else of ``2·⌈length/m⌉``
        (the only case that depends on it), by
        :func:`kattn.functional.reformer_bucket_factors`."""
        if self.num_buckets is not None:
            return bucket_factors(self.num_buckets)
        return reformer_bucket_factors(
            length if self.max_len is None else self.max_len, self.bucket_size
        )

    def buckets(self, length: int) -> int:
        """The number of buckets for a call on ``length`` (padded) tokens, the product of
        :meth:`bucket_factors`."""
        return math.prod(self.bucket_factors(length))

    def rotations(self, length: int, *, device: torch.device | str | None = None) -> Tensor:
        """The evaluation-mode rotations for ``length`` tokens, ``(H, D, R, Σ f_i/2)`` fp64,
        f the :meth:`bucket_factors` of ``length`` (cached)."""
        return self._rotations(length, 0, device)

    def _rotations(self, length: int, draw: int, device: Any) -> Tensor:
        """Draw ``draw`` (0 for eval, 1, 2, … in training) of i.i.d. N(0, 1) rotations for
        the bucket factors of a call on ``length`` tokens."""
        factors = self.bucket_factors(length)
        shape = (self.num_heads, self.head_dim, self.num_hashes, sum(factors) // 2)
        return self._drawn_normal(shape, factors, draw, device)

    # ------------------------------------------------------------------------------ forward
    def _why_not(self, capability: str) -> str:
        if capability == "cross":
            return (
                ": a query's keys are the tokens sorted next to it by hash in the same "
                "sequence, so queries and keys must be the same positions (Lq == Lk)"
            )
        return ""

    def _options(self) -> dict[str, Any]:
        return {
            "bucket_size": self.bucket_size,
            "shared_qk": self.shared_qk,
            "attend_across_buckets": self.attend_across_buckets,
            "scale": self.scale,
        }

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        rotations = self._rotations(q.shape[2], self._current_draw(), q.device)
        out = reformer_attention(
            q,
            k,
            v,
            rotations,
            causal=causal,
            key_padding_mask=key_padding_mask,
            bucket_factors=self.bucket_factors(q.shape[2]),
            **self._options(),
        )
        return _zero_gradient_to(k, out) if self.shared_qk else out

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        out = reformer_attention_reference(
            q,
            k,
            v,
            self.rotations(q.shape[2], device=q.device),
            causal=causal,
            key_padding_mask=key_padding_mask,
            bucket_factors=self.bucket_factors(q.shape[2]),
            **self._options(),
        )
        return _zero_gradient_to(k, out) if self.shared_qk else out

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"bucket_size={self.bucket_size}, num_hashes={self.num_hashes}, "
            f"num_buckets={self.num_buckets}, "
            f"shared_qk={self.shared_qk}, attend_across_buckets={self.attend_across_buckets}, "
            f"seed={self.seed}, scale={self.scale}"
        )


class _ZeroGradientTo(torch.autograd.Function):
    """Identity on ``out`` that gives ``unused`` a zero gradient: the shared-QK output does
    not depend on the given k, whose gradient is therefore exactly zero (not missing)."""

    @staticmethod
    def forward(ctx: Any, unused: Tensor, out: Tensor) -> Tensor:
        ctx.unused_meta = (unused.shape, unused.dtype, unused.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        shape, dtype, device = ctx.unused_meta
        return torch.zeros(shape, dtype=dtype, device=device), grad


def _num_buckets(value: object) -> int | tuple[int, ...] | None:
    """``num_buckets`` checked: None, an even int >= 2, or factors (a list or comma-separated
    string of even ints >= 2) as a tuple; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, int) and is_positive_int(value) and value % 2 == 0:
        return value
    items: object = value
    if isinstance(value, str):
        try:
            items = [int(x) for x in value.split(",")]
        except ValueError:
            items = None
    if isinstance(items, Sequence) and not isinstance(items, str):
        try:
            return bucket_factors(list(items))
        except ValueError:
            pass
    raise ValueError(
        "num_buckets must be an even int >= 2, a list of them (the factors of the number of "
        f"buckets, one hash each) or a comma-separated string of them, or None; got {value!r}"
    )


def _zero_gradient_to(unused: Tensor, out: Tensor) -> Tensor:
    if not (unused.requires_grad and torch.is_grad_enabled()):
        return out
    result: Tensor = _ZeroGradientTo.apply(unused, out)
    return result


register_mechanism(
    "reformer",
    ReformerAttention,
    summary="LSH attention: softmax within chunks of a hash-sorted order (shared QK, angular "
    "LSH, several rounds, keys held by two rounds counted once).",
    reference="Kitaev, Kaiser and Levskaya, Reformer: The Efficient Transformer, ICLR 2020",
    complexity="O(R·(L·log L + L·n·D + L·m·(D + Dv))) time, O(R·L·(m + D + Dv)) memory "
    "(R = num_hashes rounds, m = bucket_size, n = Σ f/2 rotation columns for num_buckets = "
    "f_1·f_2⋯, default 2·⌈max_len/m⌉ factorized in two beyond 2·max(√(max_len/m), m))",
    colour="#b15928",
    approximates="softmax",
    size_option=None,
)
