"""The data of task ``translation``: sentence pairs from ``data.path`` (or the embedded
gettext corpus), the joint BPE, the pairs as ids, and their batches of ``data.max_tokens``.

Where the pairs come from (:func:`load_pairs`):

- no ``data.path``: :func:`kattn.data.gettext_corpus`, the English messages of the programs
  installed on this machine and their human translations (``/usr/share/locale``), one side
  English. Real, human-translated and already here: nothing is downloaded and no third-party
  text ships with kattn; the catalogues read and their SHA-256 are in ``results.json``.
- a folder with ``train.<src>``: the IWSLT'14 layout fairseq prepares
  (:func:`kattn.data.load_iwslt`);
- ``PREFIX`` with files ``PREFIX.<src>`` and ``PREFIX.<tgt>``: aligned plain text, split by a
  hash of each source line (:func:`kattn.data.load_parallel_files`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import DataFormatError
from ..data.parallel import (
    SPLITS,
    ParallelCorpus,
    gettext_corpus,
    load_iwslt,
    load_parallel_files,
)
from ..data.parallel_batches import (
    TRANSLATION_VOCAB_SIZE,
    JointBPE,
    ParallelBatch,
    collate_pairs,
    token_batches,
)
from .config import RunConfig

#: defaults of the ``data`` fields task ``translation`` reads when they are None.
DEFAULT_SRC, DEFAULT_TGT = "de", "en"
DEFAULT_MAX_TOKENS = 4096
DEFAULT_MAX_LEN = 256
#: the name of a run folder's copy of its BPE vocabulary.
TOKENIZER_FILE = "tokenizer.json"


def languages(config: RunConfig) -> tuple[str, str]:
    """``(src, tgt)`` of a translation run."""
    return config.data.src or DEFAULT_SRC, config.data.tgt or DEFAULT_TGT


def max_len(config: RunConfig) -> int:
    """The longest source or target (tokens, ``<eos>``/``<bos>`` included) the model reads."""
    return config.data.max_len or DEFAULT_MAX_LEN


def max_tokens(config: RunConfig) -> int:
    """The budget of padded tokens per batch."""
    return config.data.max_tokens or DEFAULT_MAX_TOKENS


@dataclass
class TranslationData:
    """A parallel corpus as ids.

    Attributes:
        corpus: the text pairs (and the manifest of what was read).
        bpe: the joint vocabulary.
        src_ids, tgt_ids: split → the ids of each pair's sides (no ``<bos>``/``<eos>``);
            training pairs longer than ``max_len`` are left out, longer valid/test sources and
            targets are cut (the text kept for BLEU is the full reference).
        kept: split → the positions in ``corpus.split(split)`` of the pairs in ``src_ids``.
        info: counts (left out, cut), sizes and the manifest, for ``results.json``.
    """

    corpus: ParallelCorpus
    bpe: JointBPE
    src_ids: dict[str, list[list[int]]]
    tgt_ids: dict[str, list[list[int]]]
    kept: dict[str, list[int]]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.bpe.vocab_size

    def batch(self, split: str, indices: list[int]) -> ParallelBatch:
        """The padded batch of pairs ``indices`` (positions in ``src_ids[split]``)."""
        return collate_pairs(self.src_ids[split], self.tgt_ids[split], indices)

    def plan(self, split: str, budget: int, seed: int) -> list[list[int]]:
        """The batches of ``split``: every pair once, at most ``budget`` padded tokens each
        (:func:`kattn.data.token_batches`, seeded)."""
        lengths = [len(s) for s in self.src_ids[split]], [len(t) for t in self.tgt_ids[split]]
        return token_batches(*lengths, budget, seed=seed).batches


def load_pairs(config: RunConfig) -> ParallelCorpus:
    """The text pairs of ``config.data`` (see the module docstring)."""
    src, tgt = languages(config)
    path = config.data.path
    if path is None:
        return gettext_corpus(src, tgt)
    root = Path(path)
    if (root / f"train.{src}").is_file():
        return load_iwslt(root, src, tgt)
    sides = Path(f"{path}.{src}"), Path(f"{path}.{tgt}")
    if all(side.is_file() for side in sides):
        return load_parallel_files(*sides, src, tgt)
    raise DataFormatError(
        f"--data {path}: expected an IWSLT'14 folder (train.{src}, train.{tgt}, valid.*, "
        f"test.*) or a prefix of two aligned files ({sides[0]}, {sides[1]}); found neither"
    )


def load_bpe(config: RunConfig, corpus: ParallelCorpus | None, run_dir: Path | None) -> JointBPE:
    """The run folder's vocabulary when it has one, else ``data.tokenizer``'s, else a joint
    BPE of ``data.bpe_size`` ids learnt on both sides of the training pairs."""
    if run_dir is not None and (run_dir / TOKENIZER_FILE).is_file():
        return JointBPE.from_file(run_dir / TOKENIZER_FILE)
    if config.data.tokenizer:
        return JointBPE.from_file(config.data.tokenizer)
    if corpus is None:
        raise ValueError("a joint BPE is learnt on the training pairs: give the corpus")
    texts = [side for pair in corpus.train for side in pair]
    return JointBPE.train(texts, config.data.bpe_size or TRANSLATION_VOCAB_SIZE)


def load_translation(config: RunConfig, run_dir: Path | None = None) -> TranslationData:
    """The pairs, vocabulary and ids of a translation run (the run folder's vocabulary when
    ``run_dir`` holds one)."""
    corpus = load_pairs(config)
    bpe = load_bpe(config, corpus, run_dir)
    longest = max_len(config) - 1  # room for <eos> (source, target out) and <bos> (target in)
    src_ids: dict[str, list[list[int]]] = {}
    tgt_ids: dict[str, list[list[int]]] = {}
    kept: dict[str, list[int]] = {}
    left_out, cut = {}, {}
    for split in SPLITS:
        pairs = corpus.split(split)
        sources = bpe.encode_batch([s for s, _ in pairs])
        targets = bpe.encode_batch([t for _, t in pairs])
        if split == "train":
            keep = [
                i for i, (s, t) in enumerate(zip(sources, targets, strict=True))
                if len(s) <= longest and len(t) <= longest
            ]  # fmt: skip
            left_out[split], cut[split] = len(pairs) - len(keep), 0
        else:
            keep = list(range(len(pairs)))
            left_out[split] = 0
            pairs_ids = zip(sources, targets, strict=True)
            cut[split] = sum(len(s) > longest or len(t) > longest for s, t in pairs_ids)
        src_ids[split] = [sources[i][:longest] for i in keep]
        tgt_ids[split] = [targets[i][:longest] for i in keep]
        kept[split] = keep
        if not keep:
            raise DataFormatError(
                f"the {split} split has no pair of at most {longest} tokens a side (data from "
                f"{corpus.manifest.get('folder') or corpus.manifest.get('source')}): a run "
                f"trains, validates and tests on pairs of each split"
            )
    info = {
        "src": corpus.src_lang,
        "tgt": corpus.tgt_lang,
        "pairs": corpus.sizes(),
        "left_out_too_long": left_out,
        "cut_to_max_len": cut,
        "max_len": max_len(config),
        "vocab_size": bpe.vocab_size,
        "manifest": corpus.manifest,
        "pairs_sha256": _pairs_hash(corpus),
    }
    return TranslationData(corpus, bpe, src_ids, tgt_ids, kept, info)


def _pairs_hash(corpus: ParallelCorpus) -> str:
    """SHA-256 of every split's pairs (tab-joined lines in order): the corpus a run read."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for src, tgt in corpus.split(split):
            digest.update(f"{split}\t{src}\t{tgt}\n".encode())
    return digest.hexdigest()
