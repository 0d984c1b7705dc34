"""The data of the text tasks (``text-classification``, ``finetune``): labelled texts read
from GLUE, AG News's layout or the embedded set, encoded as ``[CLS] a [SEP] (b [SEP])`` ids of
a masked-LM vocabulary (:func:`kattn.data.mlm_vocab.mlm_vocab`).

Splits: ``train`` less a seeded hold-out, ``valid`` (the hold-out: a tenth of train, at most
10,000 examples, seed 0; it picks the best checkpoint), ``test`` (AG News's test.csv; GLUE's
dev set, MNLI's matched one) and, for MNLI, ``test_mismatched``. GLUE's test files have no
labels: its dev sets are what is reported, and no checkpoint is chosen on them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import SequenceDataset, Tokenizer
from ..data.agnews import load_agnews
from ..data.glue import load_glue
from ..data.mlm_vocab import MLMVocab
from ..data.text_classification_embedded import MANIFEST, embedded_text_classes
from ..data.text_examples import SpecialIds, TextExamples, encode_examples, hold_out
from .config import RunConfig

#: the share of train held out for validation, its cap and its seed.
HOLD_OUT_FRACTION, HOLD_OUT_CAP, HOLD_OUT_SEED = 0.1, 10_000, 0


def split_train(n: int) -> tuple[list[int], list[int]]:
    """The kept and the held-out (validation) ones of ``n`` training examples."""
    return hold_out(n, HOLD_OUT_FRACTION, HOLD_OUT_SEED, HOLD_OUT_CAP)


@dataclass
class TextTaskData:
    """Encoded splits of a text task and what scores them.

    Attributes:
        splits: ``train``, ``valid``, ``test`` and any other evaluated set (MNLI's
            ``test_mismatched``).
        outputs: classes, or 1 for regression.
        metrics: the official metrics (:mod:`kattn.train.glue_metrics`), headline first.
        classes: the class names (None for regression).
        vocab: the ids (specials included) the model embeds; None when a Hugging Face
            checkpoint's own tokenizer encodes the texts (:mod:`kattn.train.finetune_hf_data`).
        tokenizer: kattn's :class:`~kattn.data.Tokenizer`, or that checkpoint's tokenizer.
        info: what was read (files, sizes, cut examples, the embedded set's manifest).
    """

    splits: dict[str, SequenceDataset]
    outputs: int
    metrics: tuple[str, ...]
    classes: tuple[str, ...] | None
    vocab: MLMVocab | None
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def regression(self) -> bool:
        return self.classes is None


def read_texts(
    config: RunConfig,
) -> tuple[TextExamples, dict[str, TextExamples], tuple[str, ...], tuple[str, ...] | None, dict]:
    """The training examples, the reported sets by split name, the metrics, the class names
    (None: regression) and a description, as ``config.data`` says."""
    data = config.data
    if data.glue is not None:
        if data.path is None:
            raise ValueError(
                f"data.glue={data.glue!r} needs data.path (--data): the GLUE task's folder or "
                f"the folder holding it"
            )
        glue = load_glue(data.path, data.glue)
        names = ["test", "test_mismatched"] if len(glue.dev) == 2 else ["test"]
        sets = dict(zip(names, glue.dev.values(), strict=True))
        reported = f"the dev set{'s' if len(sets) > 1 else ''} ({', '.join(glue.dev)})"
        info = {"source": str(glue.folder), "glue": glue.task.name, "test": reported}
        return glue.train, sets, glue.task.metrics, glue.task.labels, info
    folder = Path(data.path) if data.path else embedded_text_classes()
    loaded = load_agnews(folder)
    info = {"source": str(folder), "layout": "AG News CSV"}
    if data.path is None:
        info["embedded"] = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    return loaded.train, {"test": loaded.test}, ("accuracy",), loaded.classes, info


def encode_text_task(
    config: RunConfig,
    encode: Callable[[TextExamples], tuple[SequenceDataset, int]],
    count_key: str,
    max_len: int,
    vocab: MLMVocab | None,
    tokenizer: Any,
) -> TextTaskData:
    """The text task of ``config.data``: its splits (train less the hold-out, valid, the
    reported sets) each turned into rows by ``encode``, which also counts the examples that
    ``info[count_key]`` records; ``vocab`` and ``tokenizer`` are those that encode."""
    train_all, sets, metrics, classes, info = read_texts(config)
    kept, held = split_train(len(train_all))
    texts = {"train": train_all.subset(kept), "valid": train_all.subset(held), **sets}
    splits, counted = {}, {}
    for name, examples in texts.items():
        splits[name], counted[name] = encode(examples)
    info.update({
        "valid": f"{len(held)} train examples held out at random (seed {HOLD_OUT_SEED})",
        "sizes": {name: len(split) for name, split in splits.items()},
        count_key: counted,
        "max_len": max_len,
        "classes": list(classes) if classes is not None else None,
    })  # fmt: skip
    outputs = 1 if classes is None else len(classes)
    return TextTaskData(splits, outputs, metrics, classes, vocab, tokenizer, info)


def load_text_task(
    config: RunConfig, tokenizer: Tokenizer, vocab: MLMVocab, max_len: int
) -> TextTaskData:
    """The text task of ``config.data``, encoded with ``tokenizer`` and ``vocab``'s special
    ids in sequences of ``max_len`` tokens (``info["truncated"]``: how many were cut)."""
    special = SpecialIds(vocab.pad_id, vocab.cls_id, vocab.sep_id)

    def encode(examples: TextExamples) -> tuple[SequenceDataset, int]:
        return encode_examples(examples, tokenizer.encode, special, max_len)

    return encode_text_task(config, encode, "truncated", max_len, vocab, tokenizer)
