"""Task ``mlm``: masked language modelling, BERT's pre-training (Devlin et al. 2019; Luo et al.
2021, §4.1 and Appendix A.1), through the one training loop.

A corpus (:func:`kattn.data.load_corpus`: a text file, a folder, the WikiText layout, or the
embedded standard-library sources) is tokenised and packed into sequences of ``data.max_len``
ids, ``[CLS] … [SEP]`` (:mod:`kattn.train.mlm_data`). Training batches are masked afresh at
every step (:func:`kattn.data.mask_tokens`, from a generator seeded by the step's random state,
so a resumed run draws the same masks); the valid and test splits are masked once, from a
fixed seed, so that every run is scored on the same positions. The loss is the cross-entropy
over the masked positions; metrics are that masked loss (nats per masked token), its
perplexity and the masked accuracy; the best checkpoint has the lowest validation loss.

A run folder holds, besides the loop's files, the tokenizer's file (if any),
``mlm_vocab.json`` (the special ids) and at the end ``mlm_curve.csv`` (the train and valid
loss curve) and its plot ``mlm_curve.png``; ``results.json`` adds the unigram baseline (the
masked test tokens predicted by their training frequencies) and the curve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import LMData, Tokenizer
from ..data.masking import IGNORE_INDEX, MaskedTokens, mask_tokens
from ..data.mlm_vocab import MLMVocab, mlm_vocab
from ..nn.masked_lm import MaskedLM
from .config import RunConfig, load_config
from .field_checks import (
    refuse_image_fields,
    refuse_translation_fields,
    refuse_unread_data_fields,
)
from .mlm_data import (
    CURVE,
    curve_line,
    fixed_masks,
    masking_config,
    mlm_max_len,
    pack_sequences,
    plot_curve,
    unigram_baseline,
    write_curve,
)
from .objective_base import SPLITS, Objective, token_metrics, token_rates
from .tasks import encoder_options, load_lm_data, run_tokenizer

#: the file of a run's special ids.
VOCAB_FILE = "mlm_vocab.json"


@dataclass
class MLMCorpus:
    """What :meth:`MaskedLanguageModelling.load_data` reads: the tokenised corpus, and the run
    folder it was read for (None for a new run: the loop tells it by ``write_run_files``)."""

    data: LMData
    run_dir: Path | None = None


def build_masked_lm(config: RunConfig, vocab_size: int) -> MaskedLM:
    """The :class:`~kattn.nn.MaskedLM` of ``config.model`` over ``vocab_size`` ids (specials
    included), reading sequences of ``data.max_len`` tokens, ``config.attention`` in every
    layer."""
    return MaskedLM(
        vocab_size,
        mlm_max_len(config),
        tie_embeddings=config.model.tie_embeddings,
        **encoder_options(config),
    )


class MaskedLanguageModelling(Objective[MLMCorpus]):
    """BERT's masked language modelling over packed ``[CLS] … [SEP]`` sequences (see the
    module docstring); best = lowest validation masked loss.

    Raises:
        ValueError: whole-word masking with a tokenizer that marks no word starts.
    """

    task = "mlm"
    best_metric, higher_is_better = "loss", False
    count_key = "masked_tokens"
    shown = ("loss", "accuracy", "tokens_per_s")
    embedded_data = "the embedded corpus"
    paper_preset = "luo-bert-base"
    summary_keys = ("task", "mechanism", "steps", "test_loss", "test_accuracy",
                    "test_perplexity", "best_valid_loss", "best_valid_accuracy", "unigram_loss",
                    "unigram_accuracy", "wall_time_s", "steps_per_s", "tokens_per_s",
                    "curve_file")  # fmt: skip

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        refuse_translation_fields(config)
        refuse_image_fields(config)
        why = ": its sequences are data.max_len tokens with [CLS] and [SEP]"
        refuse_unread_data_fields(config, ("block_size", "truncate"), why)
        masking_config(config)
        if mlm_max_len(config) < 3:
            raise ValueError(
                f"data.max_len must be at least 3 for task mlm, got {config.data.max_len}"
            )

    def __init__(self, config: RunConfig, data: MLMCorpus) -> None:
        super().__init__(config, data)
        self.corpus, self.run_dir = data.data, data.run_dir
        self.max_len = mlm_max_len(config)
        self.unit = f"sequences of {self.max_len} tokens"
        self.masking = masking_config(config)
        self.vocab = mlm_vocab(self.corpus.tokenizer)
        if self.masking.whole_word:
            self.vocab.require_words()
        self.rows = {
            s: pack_sequences(self.corpus.split(s), self.vocab, self.max_len) for s in SPLITS
        }
        self.fixed = {s: self._fixed_masks(s) for s in SPLITS if s != "train"}
        self.baseline: dict[str, float] | None = None

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> MLMCorpus:
        """The corpus, tokenised by the run folder's copy of the tokenizer when there is one."""
        tokenizer = None if run_dir is None else run_tokenizer(run_dir, config)
        return MLMCorpus(load_lm_data(config, tokenizer), run_dir)

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The masked LM, sized by the run's tokenizer and its special tokens (no corpus is
        read)."""
        tokenizer = run_tokenizer(run_dir, config)
        return build_masked_lm(config, mlm_vocab(tokenizer).vocab_size), tokenizer

    def build_model(self, config: RunConfig) -> nn.Module:
        return build_masked_lm(config, self.vocab.vocab_size)

    def write_run_files(self, run_dir: Path) -> None:
        """The tokenizer's file and ``mlm_vocab.json``: the run folder alone gives the model."""
        self.run_dir = run_dir
        self.corpus.tokenizer.save(run_dir)
        text = json.dumps(self.vocab.describe(), indent=2, sort_keys=True)
        (run_dir / VOCAB_FILE).write_text(text + "\n")

    def size(self, split: str) -> int:
        return self.rows[split].shape[0]

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        """Inputs, padding and targets of rows ``index``: training rows masked afresh (from a
        generator seeded by torch's random state, which the loop seeds per step), rows of an
        evaluation (no gradient: valid, test, or train read again) with their split's fixed
        masks."""
        rows = self.rows[split][index].long()
        if split == "train" and torch.is_grad_enabled():
            seed = int(torch.randint(2**62, (1,)).item())
            masked = mask_tokens(
                rows, self.vocab, torch.Generator().manual_seed(seed), self.masking
            )
            inputs, labels = masked.inputs, masked.labels
        else:
            if split not in self.fixed:  # the training split, evaluated: masked once
                self.fixed[split] = self._fixed_masks(split)
            inputs, labels = self.fixed[split].inputs[index].long(), self.fixed[split].labels[index]
        chosen = labels != IGNORE_INDEX
        batch = {
            "inputs": inputs.to(device, non_blocking=True),
            "chosen": chosen.to(device, non_blocking=True),
            "targets": labels[chosen].to(device, non_blocking=True),
        }
        padding = rows == self.vocab.pad_id
        if padding.any():  # decided on the CPU: no device sync in the forward
            batch["padding"] = padding.to(device, non_blocking=True)
        return batch

    def _fixed_masks(self, split: str) -> MaskedTokens:
        return fixed_masks(self.rows[split], self.vocab, self.masking, SPLITS.index(split))

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """Logits ``(N, V)`` at the batch's N masked positions (row-major)."""
        return net(batch["inputs"], batch.get("padding"), select=batch["chosen"])

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        return F.cross_entropy(logits.float(), batch["targets"], reduction=reduction)

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        targets = batch["targets"]
        return int((logits.argmax(-1) == targets).sum().item()), targets.numel()

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        return token_metrics(sums, "masked_tokens")

    def rates(self, steps: int, seconds: float, batch_size: int) -> dict[str, float]:
        return token_rates(steps, seconds, steps * batch_size * self.max_len)

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """The loss curve, written to ``mlm_curve.csv`` in the run folder."""
        if self.run_dir is None:
            return {"curve_file": None}
        curve = write_curve(self.run_dir)
        plotted = plot_curve(self.run_dir, curve, self._baseline()["loss"])
        return {
            "curve_file": CURVE,
            "curve_plot": None if plotted is None else plotted.name,
            "curve": curve,
            "curve_summary": curve_line(curve),
        }

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        results: dict[str, Any] = {f"test_{k}": v for k, v in test.items()}
        for key in ("loss", "perplexity", "accuracy"):
            results[f"best_valid_{key}"] = None if best is None else best[key]
        baseline = self._baseline()
        results["unigram_loss"], results["unigram_accuracy"] = (
            baseline["loss"],
            baseline["accuracy"],
        )
        results.update(self._description())
        return results

    def _baseline(self) -> dict[str, float]:
        """The unigram baseline on the masked test tokens (computed once)."""
        if self.baseline is None:
            test = self.fixed["test"]
            self.baseline = unigram_baseline(
                self.corpus.train, self.vocab, test.labels[test.chosen]
            )
        return self.baseline

    def _description(self) -> dict[str, Any]:
        m = self.masking
        return {
            "max_len": self.max_len,
            "sequences": {split: self.size(split) for split in SPLITS},
            "masking": {
                "mask_prob": m.mask_prob,
                "mask_token_share": m.mask_token_share,
                "random_token_share": m.random_token_share,
                "whole_word": m.whole_word,
                "eval_masks": "fixed (the same positions in every run)",
            },
            "vocab": self.vocab.describe(),
            "corpus": self.corpus.info,
            "tokenizer": self.corpus.tokenizer.describe(),
        }

    def summary(self, results: dict[str, Any]) -> str:
        best = results["best_valid_loss"]
        shown = "none" if best is None else f"{best:.4f}"
        return (
            f"test masked loss {results['test_loss']:.4f} (accuracy "
            f"{results['test_accuracy']:.4f}); best valid {shown} at step {results['best_step']};"
            f" unigram baseline {results['unigram_loss']:.4f} (accuracy "
            f"{results['unigram_accuracy']:.4f}); {results.get('curve_summary', 'no curve')}"
        )


def run_vocab(run_dir: str | Path) -> MLMVocab:
    """The special ids of an ``mlm`` run folder (from its tokenizer, as training made them)."""
    run = Path(run_dir)
    return mlm_vocab(run_tokenizer(run, load_config(run / "config.json")))
