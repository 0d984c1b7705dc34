"""Which kattn mechanisms give a query, attended apart from the others, the output the full
forward gives it: what the cached decoding paths of :mod:`kattn.hf.attention` assume.

A key/value cache hands the attention function fewer queries than the full forward: the
new tokens of a causal self-attention (placed after zero queries so that they keep their
positions) or the lone new query of a cross-attention (numbered from 0). A query row of most
mechanisms depends only on that query, its position and the keys, and such calls are exact.
Two kinds of mechanism break that:

- rows that depend on the other queries: buckets, clusters, landmarks or a selection built
  from all queries (Reformer's LSH with shared query-key, clustered attention, Informer's
  query selection, SMYRF, Nyströmformer and Skyformer landmarks);
- rows that depend on the query's position: a relative-position encoding (``rpe``) and
  Synthesizer's random (position-indexed) logits. Causal self-attention keeps positions;
  a cross-attention step numbers its query from 0, so there it is wrong.

The lists were drawn by checking every registered mechanism (tests/hf/test_rows.py does it
over ``kattn.available()``, so a new mechanism that needs listing fails there).
"""

from __future__ import annotations

from typing import Any

from ..attention.base import Attention
from ..attention.clustered import ClusteredAttention
from ..attention.informer import InformerAttention
from ..attention.nystromformer import NystromformerAttention
from ..attention.reformer import ReformerAttention
from ..attention.skyformer import SkyformerAttention
from ..attention.smyrf import SmyrfAttention
from ..attention.synthesizer import SynthesizerAttention

#: Mechanisms whose query rows are built from all queries (subclasses included).
QUERY_DEPENDENT: tuple[type[Attention], ...] = (
    ClusteredAttention,
    InformerAttention,
    NystromformerAttention,
    SkyformerAttention,
    SmyrfAttention,
)

ADVICE = "run the model with use_cache=False (generate recomputes the forward each step)"


def depends_on_other_queries(attn: Attention) -> bool:
    """Whether a query row of ``attn`` depends on the other queries of the call."""
    if isinstance(attn, ReformerAttention):
        return bool(attn.shared_qk)  # the keys are the queries themselves
    return isinstance(attn, QUERY_DEPENDENT)


def depends_on_query_position(attn: Attention) -> bool:
    """Whether a query row of ``attn`` depends on the query's position (not only on the
    query and the keys)."""
    if isinstance(attn, SynthesizerAttention):
        return "random" in str(attn.variant)
    rpe: Any = getattr(attn, "rpe", None)
    return rpe is not None


def check_last_rows(attn: Attention) -> None:
    """``NotImplementedError`` unless ``attn`` can attend the last queries of a causal
    self-attention after cached keys (zero queries in front of them)."""
    if depends_on_other_queries(attn):
        raise NotImplementedError(
            f"{type(attn).__name__}: a query row depends on the other queries (buckets, "
            "clusters or landmarks built from them), so a key/value cache, which hands over "
            f"only the new queries, would change the outputs; {ADVICE}"
        )


def check_cross_step(attn: Attention, offset: int) -> None:
    """``NotImplementedError`` unless ``attn`` can attend a cross-attention's queries that
    follow ``offset`` decoded ones, given apart from them."""
    if offset <= 0:
        return
    if depends_on_query_position(attn):
        raise NotImplementedError(
            f"{type(attn).__name__}: its output depends on the query's position, and a "
            "cached cross-attention step numbers its query from 0 (it is at position "
            f"{offset}); {ADVICE}"
        )
    check_last_rows(attn)
