"""Informer's ProbSparse attention (Zhou et al., Informer: Beyond Efficient Transformer for
Long Sequence Time-Series Forecasting, AAAI 2021, §3.1).

How it differs from the released code (``zhouhaoyi/Informer2020``, ``models/attn.py``
``ProbAttention``, and its copy in the Skyformer LRA code, ``pkuzengqi/Skyformer``
``src/models/attention_informer.py``; read, not copied):

- The released code divides the sum of the U sampled scores by Lk, not by U, so its
  "mean" term is shrunk by U/Lk. Here M̄ uses the mean over the sample, the estimate of the
  paper's ``(1/Lk)·Σ_j`` over all keys (eq. 4).
- It draws the sample from torch's global RNG at every call, in eval too, and has no padding
  mask (padded keys are sampled and averaged into the lazy queries' mean of V). Here the
  sample comes from the module's own seed (fixed in eval, redrawn per training forward) and
  only real keys are sampled and averaged.
- Its masked form (``mask_flag=True``, the decoder's self-attention) gives lazy queries the
  cumulative *sum* of V and ranks queries on samples that include later keys; kattn refuses
  ``causal=True`` (see :meth:`InformerAttention._why_not`). The functional form
  :func:`kattn.functional.informer_attention` has a masked variant with the cumulative mean
  and samples among earlier keys, for reproducing the decoder.
- The Skyformer runs set ``factor = ⌈128 / ln max_seq_len⌉`` (U ≈ 128 keys): the default
  here when ``max_len`` is given (see :class:`InformerAttention`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import positive_float_or_none, positive_int
from ..functional.informer import (
    InformerSample,
    informer_attention,
    informer_attention_reference,
    informer_factor,
    informer_sample,
    informer_sizes,
)
from ..registry import register_mechanism
from .base import Attention
from .seeded import SeededDraws


class InformerAttention(SeededDraws, Attention):
    """ProbSparse attention (Zhou et al. 2021, §3.1; :mod:`kattn.functional.informer`): each
    query's sparsity measurement ``M̄(q) = max − mean`` of its scores is estimated on
    U = c·⌈ln nk⌉ keys sampled for it, the u = c·⌈ln nq⌉ queries of largest M̄ get exact
    softmax attention and the others the mean of V (nq, nk: the example's real queries and
    keys, so the padding of the batch changes nothing). O((L·U + u·L)·D) = O(c·L log L·D) time
    and memory.

    Default factor c: ``⌈128 / ln max_len⌉`` when ``max_len`` is given, the setting of the
    Skyformer paper's LRA runs (Chen et al. 2021), where Informer is one of the baselines
    kattn compares against (U = c·⌈ln L⌉ ≈ 128 sampled keys, as many as the other
    mechanisms' features or landmarks); without ``max_len`` the released Informer's
    ``factor=5``. Pass ``factor`` to choose.

    Randomness: the sample (uniforms ``(Lq, U)`` mapped onto each example's real keys, one
    sample per query shared over the batch and the heads as in the released code; uniform
    ``(i, s)`` does not depend on the lengths, so an example draws the same sample alone or
    padded) follows the seeded contract of :mod:`kattn.attention.seeded` (a generator owned
    by the module, fixed in ``eval()``, redrawn per training forward, reused under
    checkpointing, seed and draws in ``state_dict()``).

    Padding: padded keys are never sampled and never counted; with Lq == Lk the mask marks
    padded queries too (never ranked among the top). Cross-attention (Lq ≠ Lk) is
    supported (U from the real keys, u from Lq; the paper's decoder uses full attention
    there). Causal attention is refused (see :meth:`_why_not`); there is no recurrent form.

    Args:
        factor: c, a positive int; None: ``⌈128 / ln max_len⌉`` (5 without max_len).
        seed: the seed of the samples, an int >= 0.
        scale: logit scale, default ``1/√D``.
    """

    supports_causal = False
    supports_cross = True
    supports_recurrent = False
    is_exact = False
    rows_depend_on_other_queries = True  # the queries attended are selected among all of them
    draw_stream = "informer"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        factor: int | None = None,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(factor=factor, seed=seed, scale=scale)
        if factor is not None:
            positive_int("factor", factor)
        self.factor = informer_factor(max_len) if factor is None else factor
        self.scale = positive_float_or_none("scale", scale)
        self._init_seeded(seed)

    # ------------------------------------------------------------------------------ sample
    def sizes(self, lq: int, lk: int) -> tuple[int, int]:
        """``(U, u)``: keys sampled per query and exact queries at these lengths."""
        return informer_sizes(lq, lk, self.factor)

    def uniforms(self, lq: int, lk: int, device: torch.device | str | None = None) -> Tensor:
        """The evaluation-mode uniforms ``(Lq, U)`` (float64, cached); entry ``(i, s)`` is
        the same at any lengths that have it."""
        return self._uniforms(lq, self.sizes(lq, lk)[0], 0, device)

    def _uniforms(self, rows: int, columns: int, draw: int, device: Any) -> Tensor:
        """Draw ``draw`` (0 for eval, 1, 2, … in training) of the uniforms ``(rows, columns)``.

        Entry ``(i, s)`` depends on neither size: columns come in groups of c (U = c·⌈ln n⌉
        grows by whole groups), group g from its own generator, filled row by row, so a
        shorter table is the corner of a longer one. An example alone and the same example
        inside a longer padded batch therefore draw the same sample."""
        groups = -(-columns // self.factor)

        def make(_: torch.Generator) -> Tensor:
            parts = [
                torch.rand(
                    (rows, self.factor), generator=self._generator(draw, g), dtype=torch.float64
                )
                for g in range(groups)
            ]
            return torch.cat(parts, dim=1)[:, :columns].to(device)

        return self._drawn((rows, columns), draw, device, make)

    def _sizes_per_example(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor | None, int | Tensor, int]:
        """U and u of each example from its real lengths (``(B,)`` tensors; None and an int
        without a mask), and the largest U."""
        b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
        if key_padding_mask is None or b == 0:
            samples, top = self.sizes(lq, lk)
            return None, top, samples
        real_k = (~key_padding_mask).sum(1).tolist()
        real_q = real_k if lq == lk else [lq] * b
        sizes = [self.sizes(max(nq, 1), max(nk, 1)) for nq, nk in zip(real_q, real_k, strict=True)]
        samples_b = torch.tensor([u for u, _ in sizes], device=q.device)
        top_b = torch.tensor([t for _, t in sizes], device=q.device)
        return samples_b, top_b, int(samples_b.max())

    def _sample(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None, draw: int
    ) -> tuple[InformerSample, int | Tensor]:
        """The sample of keys and the exact queries u (per example with a mask)."""
        samples_b, top, samples = self._sizes_per_example(q, k, key_padding_mask)
        uniforms = self._uniforms(q.shape[2], samples, draw, q.device)
        sample = informer_sample(
            uniforms,
            batch=q.shape[0],
            lk=k.shape[2],
            key_padding_mask=key_padding_mask,
            num_samples=samples_b,
        )
        return sample, top

    # ------------------------------------------------------------------------------ forward
    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return (
                ": ProbSparse ranks each query's sparsity against every other query's to pick "
                "the exact ones, so whether an earlier query gets exact attention depends on "
                "later tokens"
            )
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        sample, top = self._sample(q, k, key_padding_mask, self._current_draw())
        return informer_attention(
            q,
            k,
            v,
            sample,
            num_top=top,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
        )

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        sample, top = self._sample(q, k, key_padding_mask, 0)
        return informer_attention_reference(
            q,
            k,
            v,
            sample,
            num_top=top,
            key_padding_mask=key_padding_mask,
            scale=self.scale,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, factor={self.factor}, "
            f"seed={self.seed}, scale={self.scale}"
        )


register_mechanism(
    "informer",
    InformerAttention,
    summary="ProbSparse attention: exact softmax for the c·ln L queries whose sampled scores "
    "are the most peaked, the mean of V for the others.",
    reference="Zhou et al., Informer: Beyond Efficient Transformer for Long Sequence "
    "Time-Series Forecasting, AAAI 2021",
    complexity="O(c·L log L·D) time and memory (U = c·⌈ln L⌉ sampled keys per query, "
    "u = c·⌈ln L⌉ exact queries)",
    approximates="softmax",
    size_option=None,
    colour="#31a354",
)
