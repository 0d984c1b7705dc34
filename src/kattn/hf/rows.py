"""The refusals of the cached decoding paths of :mod:`kattn.hf.attention`, which assume that
a query, attended apart from the others, gets the output the full forward gives it.

A key/value cache hands the attention function fewer queries than the full forward: the
new tokens of a causal self-attention (placed after zero queries so that they keep their
positions) or the lone new query of a cross-attention (numbered from 0). A query row of most
mechanisms depends only on that query, its position and the keys, and such calls are exact.
Each mechanism's flags (:data:`kattn.attention.base.ROW_FLAGS`, which may depend on its
options) say where that breaks:

- ``rows_depend_on_other_queries``: buckets, clusters, landmarks or a selection built from
  all queries (Reformer's LSH with shared query-key, clustered attention, Informer's query
  selection, SMYRF, Nyströmformer and Skyformer landmarks);
- ``rows_depend_on_position``: a relative-position encoding (``rpe``) or Synthesizer's
  random (position-indexed) logits. Causal self-attention keeps positions; a
  cross-attention step numbers its query from 0, so there it is wrong.

tests/hf/test_rows.py checks the flags of every registered mechanism against what its
outputs do, so a mechanism with a wrong flag fails there.
"""

from __future__ import annotations

from ..attention.base import Attention

ADVICE = "run the model with use_cache=False (generate recomputes the forward each step)"


def check_last_rows(attn: Attention) -> None:
    """``NotImplementedError`` unless ``attn`` can attend the last queries of a causal
    self-attention after cached keys (zero queries in front of them)."""
    if attn.rows_depend_on_other_queries:
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
    if attn.rows_depend_on_position:
        raise NotImplementedError(
            f"{type(attn).__name__}: its output depends on the query's position, and a "
            "cached cross-attention step numbers its query from 0 (it is at position "
            f"{offset}); {ADVICE}"
        )
    check_last_rows(attn)
