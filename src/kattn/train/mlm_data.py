"""The data of task ``mlm``: a tokenised corpus packed into ``[CLS] … [SEP]`` sequences, the
fixed masks of the evaluation splits, the unigram baseline, and the loss curve a run writes.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data import DataFormatError
from ..data.masking import MaskedTokens, MaskingConfig, mask_tokens
from ..data.mlm_vocab import MLMVocab
from .config import MLM_MAX_LEN, RunConfig
from .metrics import iter_records

#: the seed of the evaluation splits' masks: the same for every run, so that runs with other
#: seeds, mechanisms or models are scored on the same masked positions.
EVAL_MASK_SEED = 1_000_003
#: the file of a run's MLM loss curve (train and valid, one row per logged step), and its plot.
CURVE = "mlm_curve.csv"
CURVE_PLOT = "mlm_curve.png"
#: how many evaluation rows are masked at once (bounds the memory of the argsort).
MASK_ROWS = 4096


def mlm_max_len(config: RunConfig) -> int:
    """Tokens per sequence of task ``mlm`` (``data.max_len`` or :data:`MLM_MAX_LEN`)."""
    return config.data.max_len or MLM_MAX_LEN


def masking_config(config: RunConfig) -> MaskingConfig:
    """The masking that ``config.data`` asks for (a ``ValueError`` naming the field when a
    share is out of range)."""
    data = config.data
    try:
        return MaskingConfig(
            data.mask_prob, data.mask_token_share, data.random_token_share, data.whole_word_mask
        )
    except ValueError as err:
        raise ValueError(f"data.{err}") from None


def pack_sequences(tokens: Tensor, vocab: MLMVocab, max_len: int) -> Tensor:
    """``(N,)`` ids cut into consecutive pieces of ``max_len − 2`` tokens, each as one row
    ``[CLS] piece [SEP]`` of ``max_len`` ids, the last one padded with [PAD]: ``(S, max_len)``
    int16 when the vocabulary fits, else int32 (a corpus of bytes takes two bytes per id).

    Raises:
        ValueError: ``max_len`` is below 3 (no room for a token between [CLS] and [SEP]).
        DataFormatError: ``tokens`` is empty.
    """
    if max_len < 3:
        raise ValueError(
            f"data.max_len must be at least 3 for task mlm ([CLS] x [SEP]), got {max_len}"
        )
    if len(tokens) == 0:
        raise DataFormatError("a split of the corpus has no tokens: give a longer corpus")
    dtype = torch.int16 if vocab.vocab_size <= torch.iinfo(torch.int16).max else torch.int32
    piece = max_len - 2
    rows = math.ceil(len(tokens) / piece)
    packed = torch.full((rows, max_len), vocab.pad_id, dtype=dtype)
    packed[:, 0] = vocab.cls_id
    full = (rows - 1) * piece  # the tokens of the rows before the last
    packed[:-1, 1:-1] = tokens[:full].view(rows - 1, piece).to(dtype)
    packed[:-1, -1] = vocab.sep_id
    last = len(tokens) - full
    packed[-1, 1 : last + 1] = tokens[full:].to(dtype)
    packed[-1, last + 1] = vocab.sep_id
    return packed


def fixed_masks(
    rows: Tensor, vocab: MLMVocab, masking: MaskingConfig, split_index: int
) -> MaskedTokens:
    """The masks of an evaluation split: drawn once from :data:`EVAL_MASK_SEED` (and the
    split), a block of :data:`MASK_ROWS` rows at a time, whatever the batch size."""
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED + split_index)
    parts = [mask_tokens(block, vocab, generator, masking) for block in rows.split(MASK_ROWS)]
    inputs = torch.cat([p.inputs for p in parts]).to(rows.dtype)
    return MaskedTokens(inputs, torch.cat([p.labels for p in parts]))


def unigram_baseline(train: Tensor, vocab: MLMVocab, targets: Tensor) -> dict[str, float]:
    """The masked tokens ``targets (N,)`` predicted by the add-one-smoothed frequencies of the
    ordinary ids in ``train``: the cross-entropy (nats per masked token) and the accuracy of
    always guessing the most frequent id."""
    counts = torch.bincount(train.long().flatten(), minlength=vocab.vocab_size).double()
    ordinary = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    ordinary[vocab.ordinary_ids] = True
    counts = torch.where(ordinary, counts[: vocab.vocab_size] + 1.0, torch.zeros(()))
    log_p = counts.log() - counts.sum().log()
    targets = targets.long()
    return {
        "loss": float(-log_p[targets].mean()),
        "accuracy": float((targets == counts.argmax()).double().mean()),
    }


def write_curve(run_dir: Path) -> dict[str, list[list[float]]]:
    """Write the run's MLM loss curve, ``<run>/mlm_curve.csv`` (step, split, loss, accuracy,
    perplexity) for the train and valid records of ``metrics.jsonl``; return it as
    ``{split: [[step, loss, accuracy], …]}``."""
    curve: dict[str, list[list[float]]] = {"train": [], "valid": []}
    with (run_dir / CURVE).open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["step", "split", "loss", "accuracy", "perplexity"])
        for record in iter_records(run_dir):
            if record["split"] in curve:
                step, loss, accuracy = record["step"], record["loss"], record["accuracy"]
                curve[record["split"]].append([step, loss, accuracy])
                perplexity = f"{record['perplexity']:.4f}"
                writer.writerow(
                    [step, record["split"], f"{loss:.6f}", f"{accuracy:.6f}", perplexity]
                )
    return curve


def plot_curve(run_dir: Path, curve: dict[str, Any], baseline: float) -> Path | None:
    """Plot the curve (masked loss against step, train and valid) with the unigram
    ``baseline`` to ``<run>/mlm_curve.png``; None, with a warning, without matplotlib."""
    from ..bench.style import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for split, style in (("train", "-"), ("valid", "o-")):
        points = curve.get(split) or []
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=split)
    ax.axhline(baseline, color="grey", linestyle="--", label="unigram baseline (test)")
    ax.set_xlabel("step")
    ax.set_ylabel("masked loss (nats per masked token)")
    ax.legend()
    return save_figure(fig, run_dir / CURVE_PLOT)


def curve_line(curve: dict[str, Any]) -> str:
    """The validation curve in a few words: first and last masked loss, how many points."""
    valid = curve.get("valid") or []
    if not valid:
        return "no validation yet"
    first, last = valid[0], valid[-1]
    return (
        f"valid masked loss {first[1]:.3f} at step {first[0]} → {last[1]:.3f} at step {last[0]} "
        f"({len(valid)} evaluations, {CURVE})"
    )
