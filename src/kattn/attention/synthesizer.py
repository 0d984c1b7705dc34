"""Synthesizer (Tay, Bahri, Metzler, Juan, Zhao, Zheng, "Synthesizer: Rethinking
Self-Attention for Transformer Models", ICML 2021): attention weights synthesised without
query–key interactions.

How it differs from the paper and the released Long Range Arena code (read, not copied):

- The Dense Synthesizer reads each token's per-head query vector: a kattn mechanism receives
  projected heads only, while the paper's F(X_i) reads the layer input (LRA projects the
  input to head_dim per head, then shares the last layer across heads; here both layers are
  per head).
- Factorised Dense: the paper needs a·b = ℓ; here a = ``factor`` (default ⌈√max_len⌉) and
  b = ⌈max_len / a⌉, so a·b ≥ max_len for any max_len, and the logits are cut to Lk.
- Mixture with dot-product attention: the paper weighs the mixed synthesizers with learned
  weights that sum to one; here ``softmax(α_h·S + (1 − α_h)·q kᵀ/√D)`` with
  α_h = sigmoid(a_h) per head (starting at 1/2). LRA adds the two logits unweighted.
- Defaults: the paper's Dense Synthesizer without mixture (LRA ran ``random`` mixed with dot
  products); ``rank=32`` for the factorised random form (LRA's k).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import positive_float_or_none, positive_int
from ..functional.numerics import accumulation_dtype
from ..functional.softmax import KVCache
from ..functional.synthesizer import (
    DenseWeights,
    dense_synthesizer_logits,
    factorized_dense_logits,
    factorized_dense_logits_reference,
    factorized_random_logits,
    random_synthesizer_logits,
    synthesizer_attention,
    synthesizer_attention_reference,
)
from ..registry import register_mechanism
from .base import Attention

VARIANTS = ("dense", "random", "factorized_dense", "factorized_random")
MIXES = ("none", "dot")


def _uniform(bound: float, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


def _dense_params(num_heads: int, head_dim: int, out: int) -> nn.ParameterList:
    """W1, b1, W2, b2 of a per-head two-layer network head_dim → head_dim → out, with
    ``nn.Linear``'s initialisation."""
    bound = 1.0 / math.sqrt(head_dim)
    return nn.ParameterList(
        [
            _uniform(bound, num_heads, head_dim, head_dim),
            _uniform(bound, num_heads, head_dim),
            _uniform(bound, num_heads, head_dim, out),
            _uniform(bound, num_heads, out),
        ]
    )


class SynthesizerAttention(Attention):
    """``softmax(S) V`` with synthetic logits S (Tay et al. 2021), one of ``variant``:

    - ``"dense"``: ``S_i = W2 relu(W1 q_i + b1) + b2`` over ``max_len`` key positions, cut to
      Lk (per head).
    - ``"random"``: a learned ``(max_len, max_len)`` table per head (``fixed_random=True``:
      drawn once and frozen, a buffer kept in the ``state_dict``).
    - ``"factorized_dense"``: ``S_ij = A_i[j mod a] · B_i[⌊j / a⌋]`` with A, B from two
      such networks of a and b outputs (``factor`` = a).
    - ``"factorized_random"``: ``S = R1 R2ᵀ`` with R1, R2 ``(max_len, rank)`` per head.

    ``mix="dot"`` mixes in dot-product logits, ``softmax(α·S + (1 − α)·q kᵀ/√D)`` with a
    learned α per head (:func:`~kattn.functional.synthesizer_attention`). Causal: keys
    ``j <= i``; padded keys are zeroed and masked. Decoding step by step is exact: step t reads
    row t of S over the cached keys ``<= t`` (a key/value cache; positions up to max_len).
    O(Lq·Lk·Dv) time and O(Lq·Lk) memory: the synthetic matrix is quadratic by design. It is
    learned, not an estimate of softmax attention (``approximates`` is None).

    Args:
        variant: one of ``"dense"``, ``"random"``, ``"factorized_dense"``,
            ``"factorized_random"``.
        mix: ``"none"`` or ``"dot"``.
        fixed_random: freeze the random table(s) (random variants only).
        rank: k of ``"factorized_random"`` (default 32).
        factor: a of ``"factorized_dense"`` (default ⌈√max_len⌉).
        scale: dot-product scale of the mixture, default ``1/√D``.
    """

    supports_recurrent = True
    limits_length = True

    @classmethod
    def capabilities(cls, **options: Any) -> dict[str, bool]:
        """The class flags; the random variants' logits are indexed by the query's position
        (row i of S), the dense ones' are computed from the query."""
        flags = super().capabilities(**options)
        if "variant" in options:
            flags["rows_depend_on_position"] = "random" in str(options["variant"])
        return flags

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        variant: str = "dense",
        mix: str = "none",
        fixed_random: bool = False,
        rank: int | None = None,
        factor: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self._check_option_types(
            variant=variant, mix=mix, fixed_random=fixed_random, rank=rank, factor=factor,
            scale=scale,
        )  # fmt: skip
        assert max_len is not None
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
        if fixed_random and "random" not in variant:
            raise ValueError(f"fixed_random applies to the random variants, not {variant!r}")
        if rank is not None and variant != "factorized_random":
            raise ValueError(f"rank applies to variant='factorized_random', not {variant!r}")
        if factor is not None and variant != "factorized_dense":
            raise ValueError(f"factor applies to variant='factorized_dense', not {variant!r}")
        self.variant, self.mix, self.fixed_random = variant, mix, fixed_random
        self._set_capabilities(variant=variant)
        self.table: Tensor
        self.left: Tensor
        self.right: Tensor
        self.scale = positive_float_or_none("scale", scale)
        self.rank = positive_int("rank", 32 if rank is None else rank)
        self.factor = positive_int(
            "factor", math.isqrt(max_len - 1) + 1 if factor is None else factor
        )
        if variant == "dense":
            self.dense = _dense_params(num_heads, head_dim, max_len)
        elif variant == "factorized_dense":
            self.dense_a = _dense_params(num_heads, head_dim, self.factor)
            self.dense_b = _dense_params(num_heads, head_dim, -(-max_len // self.factor))
        else:
            shapes = (
                {"table": (max_len, max_len)}
                if variant == "random"
                else {"left": (max_len, self.rank), "right": (max_len, self.rank)}
            )
            for name, (rows, cols) in shapes.items():
                table = torch.empty(num_heads, rows, cols).uniform_(-1, 1)
                table *= math.sqrt(6.0 / (rows + cols))  # Xavier-uniform, as LRA
                if fixed_random:
                    self.register_buffer(name, table)
                else:
                    setattr(self, name, nn.Parameter(table))
        if mix == "dot":
            self.mix_logit = nn.Parameter(torch.zeros(num_heads))  # α = 1/2

    # ---------------------------------------------------------------------------- synthetic
    def synthetic(self, q: Tensor, lk: int, *, offset: int = 0, reference: bool = False) -> Tensor:
        """S ``(B or 1, H, Lq, Lk)`` for queries q ``(B, H, Lq, D)`` at positions
        ``offset …`` (the random tables are indexed by position; dense ones read q).
        ``reference``: the factorised dense logits by the paper's tiling, written out."""
        acc = accumulation_dtype(q.dtype)
        lq = q.shape[2]
        if self.variant == "dense":
            return dense_synthesizer_logits(q.to(acc), self._weights(self.dense, acc), lk)
        if self.variant == "factorized_dense":
            logits = factorized_dense_logits_reference if reference else factorized_dense_logits
            first, second = self._weights(self.dense_a, acc), self._weights(self.dense_b, acc)
            return logits(q.to(acc), first, second, lk)
        if self.variant == "random":
            return random_synthesizer_logits(self.table.to(acc), lq, lk, offset=offset)
        return factorized_random_logits(
            self.left.to(acc), self.right.to(acc), lq, lk, offset=offset
        )

    @staticmethod
    def _weights(params: nn.ParameterList, dtype: torch.dtype) -> DenseWeights:
        return DenseWeights(*(p.to(dtype) for p in params))

    def _mixture(self, q: Tensor, k: Tensor) -> dict[str, Any]:
        if self.mix == "none":
            return {}
        return {"q": q, "k": k, "alpha": torch.sigmoid(self.mix_logit), "scale": self.scale}

    # ------------------------------------------------------------------------------ forward
    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        out = synthesizer_attention(
            self.synthetic(q, k.shape[2]),
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            **self._mixture(q, k),
        )
        return self._link_unread(out, q, k)

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        out = synthesizer_attention_reference(
            self.synthetic(q, k.shape[2], reference=True),
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            **self._mixture(q, k),
        )
        return self._link_unread(out, q, k)

    def _link_unread(self, out: Tensor, q: Tensor, k: Tensor) -> Tensor:
        """``out`` joined to the inputs the synthetic logits do not read (k without the
        dot-product mixture, q too for the random variants) through an empty slice: their
        gradient is then zero, as it is mathematically, rather than None, and no value of theirs
        (not even a NaN) is read."""
        unread = [] if self.mix == "dot" else [k] if "dense" in self.variant else [q, k]
        for x in unread:
            out = out + x[..., :0].sum().to(out.dtype)
        return out

    # ---------------------------------------------------------------------------- recurrent
    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> KVCache:
        keys = torch.empty(batch_size, self.num_heads, 0, self.head_dim, device=device, dtype=dtype)
        return KVCache(keys, keys.new_empty(batch_size, self.num_heads, 0, 0), 0)

    def _step(
        self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Token t = ``state.length``: row t of S over the cached keys and this one."""
        if not isinstance(state, KVCache):
            raise ValueError(
                f"state must be a KVCache (from init_state), got {type(state).__name__}"
            )
        keys, values, t = state
        if keys.shape[:2] != q_t.shape[:2] or (t and values.shape[-1] != v_t.shape[-1]):
            raise ValueError(
                f"state holds keys {tuple(keys.shape)} and values {tuple(values.shape)}; this "
                f"token has batch {q_t.shape[0]}, heads {q_t.shape[1]}, value dim {v_t.shape[-1]}"
            )
        assert self.max_len is not None
        if t >= self.max_len:
            raise ValueError(f"position {t} is beyond max_len={self.max_len} given to build")
        keys = torch.cat([keys[:, :, :t].to(k_t.dtype), k_t], dim=2)
        values = torch.cat([values[:, :, :t].to(v_t.dtype), v_t], dim=2) if t else v_t
        out = synthesizer_attention(
            self.synthetic(q_t, t + 1, offset=t), values, **self._mixture(q_t, keys)
        )
        return out, KVCache(keys, values, t + 1)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, max_len={self.max_len}, "
            f"variant={self.variant!r}, mix={self.mix!r}, fixed_random={self.fixed_random}, "
            f"rank={self.rank}, factor={self.factor}, scale={self.scale}"
        )


register_mechanism(
    "synthesizer",
    SynthesizerAttention,
    summary="Synthesizer: attention weights synthesised per token (dense) or learned per "
    "position (random), optionally mixed with dot-product attention.",
    reference="Tay, Bahri, Metzler, Juan, Zhao, Zheng, Synthesizer: Rethinking Self-Attention "
    "for Transformer Models, ICML 2021",
    complexity="O(Lq·Lk·(D + Dv)) time, O(Lq·Lk) memory (quadratic by design)",
    size_option=None,
    colour="#636363",
)
