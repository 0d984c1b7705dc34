"""Translating with a trained :class:`~kattn.nn.Seq2Seq` and scoring it with BLEU.

BLEU (Papineni et al. 2002) is sacrebleu's corpus BLEU (Post 2018) on detokenised text: the
hypotheses are the decoded BPE ids (byte-level BPE gives the text back exactly) and the
references the split's target sentences as read. With IWSLT'14 as fairseq prepares it, that
text is already tokenised and lowercased, so the score is BLEU of those tokens (sacrebleu's
13a tokenizer splits little more): comparable across kattn runs, close to but not the same
as the papers' ``fairseq-generate`` BLEU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.parallel_batches import BOS_ID, EOS_ID, JointBPE, collate_pairs
from ..nn.seq2seq_search import beam_search, greedy_decode

#: sentences per decoding batch (sorted by length, so padding stays small).
DECODE_BATCH = 64


@dataclass(frozen=True)
class Decoding:
    """How sentences are decoded: beam search of ``beam_size`` (1: greedy) with fairseq's
    ``length_penalty``, at most ``max_len_a · n + max_len_b`` tokens for n source tokens."""

    beam_size: int = 5
    length_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _sacrebleu() -> Any:
    try:
        import sacrebleu
    except ImportError:
        raise ImportError(
            "BLEU needs sacrebleu: pip install 'kattn[translation]' (or pip install sacrebleu)"
        ) from None
    return sacrebleu


def check_bleu_available() -> None:
    """An ``ImportError`` saying what to install when sacrebleu is missing (before training)."""
    _sacrebleu()


@torch.no_grad()
def translate_ids(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    decoding: Decoding,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """The decoded target ids of each source (ids without ``<eos>``), in the order given."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[list[int]] = [[] for _ in sources]
    search: Any = greedy_decode if decoding.beam_size == 1 else beam_search
    extra = {} if decoding.beam_size == 1 else {"beam_size": decoding.beam_size}
    for start in range(0, len(order), DECODE_BATCH):
        rows = order[start : start + DECODE_BATCH]
        batch = collate_pairs(sources, [[] for _ in sources], rows)
        src = batch.src.to(device)
        padding = batch.src_padding.to(device) if bool(batch.src_padding.any()) else None
        tokens, _ = search(
            model, src, padding, bos=BOS_ID, eos=EOS_ID, length_penalty=decoding.length_penalty,
            max_len_a=decoding.max_len_a, max_len_b=decoding.max_len_b, **extra,
        )  # fmt: skip
        for i, hyp in zip(rows, tokens, strict=True):
            out[i] = hyp
    return out


def translate_texts(
    model: nn.Module,
    bpe: JointBPE,
    texts: Sequence[str],
    decoding: Decoding,
    device: torch.device | str = "cpu",
    max_len: int | None = None,
) -> list[str]:
    """The translations of ``texts`` (sources cut to ``max_len − 1`` tokens when given)."""
    ids = bpe.encode_batch(list(texts))
    if max_len is not None:
        ids = [row[: max_len - 1] for row in ids]
    return [bpe.decode(row) for row in translate_ids(model, ids, decoding, device)]


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """sacrebleu's corpus BLEU of ``hypotheses`` against one reference each: the score
    (0–100), its n-gram precisions, brevity penalty and signature."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    sb = _sacrebleu()
    metric = sb.metrics.BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": float(result.score),
        "precisions": [float(p) for p in result.precisions],
        "brevity_penalty": float(result.bp),
        "sentences": len(hypotheses),
        "signature": str(metric.get_signature()),
    }
