"""What the one training loop optimises and reports, per kind of task.

An :class:`Objective` owns a task's data and says how batches are drawn and scored: which
examples a split has, the tensors of a batch, the model's logits and loss, the summed
statistics of a batch, the metrics they give, which validation result is the best, and the
task's entries of ``results.json``. It also says what differs before and around training: how
the data are read, which model is built, what a run folder keeps besides the config, how the
run's header describes the data. :class:`Classification` (the LRA tasks; best = highest
accuracy), :class:`LanguageModelling` (task ``lm``: next-token prediction over contiguous
blocks of a corpus; best = lowest loss), :class:`~kattn.train.mlm.MaskedLanguageModelling`
(task ``mlm``: BERT's masked tokens of packed sequences; best = lowest masked loss),
:class:`~kattn.train.translation.Translation`
(sentence pairs; best = lowest loss, BLEU at the end) and the image tasks
(:class:`~kattn.train.image_classification.ImageClassification`, best = highest accuracy,
top-5 at the end; :class:`~kattn.train.image_generation.ImageGeneration`, best = lowest
bits/dim, samples at the end) and the text tasks
(:class:`~kattn.train.finetune.TextClassification` from scratch,
:class:`~kattn.train.finetune.FineTuning` from an ``mlm`` run; best = highest accuracy, GLUE's
official metrics at the end).
:data:`OBJECTIVES` is the one place that chooses the objective of a task.

Summed statistics are ``[loss_sum, correct, count]`` (count: examples or target tokens), so
that processes and batches add them up before any division.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import DataFormatError, LMData, TaskData, Tokenizer, unigram_bits_per_byte
from .batches import key_mask, majority_baseline, make_batch
from .config import CLASSIFICATION_TASKS, RunConfig
from .field_checks import (
    refuse_image_fields,
    refuse_translation_fields,
    refuse_unread_data_fields,
)
from .finetune import FineTuning, FineTuningHF, TextClassification
from .image_classification import ImageClassification
from .image_generation import ImageGeneration
from .mlm import MaskedLanguageModelling
from .objective_base import (
    SPLITS,
    ClassAccuracy,
    Objective,
    shuffled_index,
    token_metrics,
    token_rates,
)
from .tasks import block_size, build_lm, load_lm_data, load_task, run_tokenizer
from .tasks import build_model as build_classifier
from .translation import Translation


class Classification(ClassAccuracy, Objective[TaskData]):
    """Sequence (pair) classification of an LRA task; best = highest validation accuracy."""

    best_metric, higher_is_better = "accuracy", True
    count_key = "examples"
    shown = ("loss", "accuracy", "steps_per_s")
    embedded_data = "the embedded ListOps set"  # the one task with a default data set
    unit = "examples"
    paper_preset = "skyformer"
    summary_keys = ("task", "mechanism", "steps", "test_accuracy", "best_valid_accuracy",
                    "majority_baseline", "wall_time_s", "steps_per_s")  # fmt: skip

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        for key in ("block_size", "tokenizer"):
            if getattr(config.data, key) is not None:
                raise ValueError(f"data.{key} is for task lm, not {config.data.task}")
        refuse_translation_fields(config)
        refuse_image_fields(config)

    @staticmethod
    def has_embedded_data(task: str) -> bool:
        return task == "listops"

    def __init__(self, config: RunConfig, data: TaskData) -> None:
        super().__init__(config, data)
        self.pad_id_mask, self.task = config.data.pad_id_mask, data.task
        for split in SPLITS:
            if not len(getattr(data, split)):
                raise ValueError(
                    f"the {split} split of task {data.task} has no examples (data from "
                    f"{data.info.get('source', 'memory')}): a run trains, validates and tests "
                    f"on examples of each split"
                )

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> TaskData:
        return load_task(config)

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The classifier, sized by the task's data (read again)."""
        return build_classifier(config, load_task(config)), None

    def build_model(self, config: RunConfig) -> nn.Module:
        return build_classifier(config, self.data)

    def size(self, split: str) -> int:
        return len(getattr(self.data, split))

    def eval_index(self, split: str, limit: int | None, seed: int) -> Tensor:
        """Every example in order, or the first ``limit`` of a fixed shuffled order."""
        return shuffled_index(self.size(split), limit, seed)

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        return make_batch(getattr(self.data, split), index, device)

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        mask = key_mask(batch["tokens"], batch["lengths"], self.pad_id_mask)
        if "tokens2" in batch:
            mask2 = key_mask(batch["tokens2"], batch["lengths2"], self.pad_id_mask)
            return net(batch["tokens"], batch["tokens2"], mask, mask2)
        return net(batch["tokens"], mask)

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        return F.cross_entropy(logits.float(), batch["labels"], reduction=reduction)

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        return {
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "test_examples": test["examples"],
            "best_valid_accuracy": None if best is None else best["accuracy"],
            "majority_baseline": majority_baseline(self.data),
            "data": {k: v for k, v in self.data.info.items() if k != "vocabulary"},
        }

    def summary(self, results: dict[str, Any]) -> str:
        return (
            f"test accuracy {results['test_accuracy']:.4f} (best valid "
            f"{results['best_valid_accuracy']} at step {results['best_step']}); majority "
            f"baseline {results['majority_baseline']:.4f}"
        )


class LanguageModelling(Objective[LMData]):
    """Next-token prediction over contiguous blocks of ``block_size + 1`` tokens of each split
    (inputs: the first ``block_size``; targets: the same shifted by one), so an evaluation
    scores every token of the split's full blocks once; best = lowest validation loss.

    Metrics: ``loss`` (nats per token), ``perplexity`` = exp(loss), next-token ``accuracy``
    and ``bits_per_byte`` = summed nats / ln 2 / the UTF-8 bytes the scored targets stand for
    (exact for bytes; for subword tokens, targets × the split's bytes per token).

    Raises:
        DataFormatError: a split holds less than one block.
    """

    task = "lm"
    best_metric, higher_is_better = "loss", False
    count_key = "tokens"
    shown = ("loss", "bits_per_byte", "tokens_per_s")
    embedded_data = "the embedded corpus"
    paper_preset = "luo-lm"
    summary_keys = ("task", "mechanism", "steps", "test_loss", "test_perplexity",
                    "test_bits_per_byte", "best_valid_loss", "best_valid_bits_per_byte",
                    "unigram_bits_per_byte", "wall_time_s", "steps_per_s",
                    "tokens_per_s")  # fmt: skip
    needs_causal = True

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        refuse_translation_fields(config)
        refuse_image_fields(config)
        why = ": its sequences are blocks of data.block_size tokens"
        refuse_unread_data_fields(config, ("max_len", "truncate"), why)

    def __init__(self, config: RunConfig, data: LMData) -> None:
        super().__init__(config, data)
        self.block_size = size = block_size(config)
        self.unit = f"blocks of {size} tokens"
        self.blocks: dict[str, Tensor] = {}
        for split in SPLITS:
            tokens = data.split(split)
            if len(tokens) < size + 1:
                raise DataFormatError(
                    f"the {split} split has {len(tokens)} tokens, fewer than one block of "
                    f"data.block_size + 1 = {size + 1}: give a longer corpus or a smaller "
                    f"--block-size"
                )
            self.blocks[split] = tokens.unfold(0, size + 1, size)  # a view

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> LMData:
        """The corpus, tokenised by the run folder's copy of the tokenizer when there is one."""
        return load_lm_data(config, None if run_dir is None else run_tokenizer(run_dir, config))

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The causal LM, sized by the run's tokenizer (no corpus is read)."""
        tokenizer = run_tokenizer(run_dir, config)
        return build_lm(config, tokenizer.vocab_size), tokenizer

    def build_model(self, config: RunConfig) -> nn.Module:
        return build_lm(config, self.data.vocab_size)

    def write_run_files(self, run_dir: Path) -> None:
        """The tokenizer's file, so that the run folder alone is enough to generate text."""
        self.data.tokenizer.save(run_dir)

    def size(self, split: str) -> int:
        return self.blocks[split].shape[0]

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        rows = self.blocks[split][index].long()
        inputs, targets = rows[:, :-1], rows[:, 1:]
        return {
            "inputs": inputs.to(device, non_blocking=True),
            "targets": targets.to(device, non_blocking=True),
        }

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["inputs"])  # (B, L, V)

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        targets = batch["targets"]
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        targets = batch["targets"]
        return int((logits.argmax(-1) == targets).sum().item()), targets.numel()

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        nats, _, n = sums
        scored_bytes = n * self.data.bytes_per_token(split)
        bits = nats / math.log(2) / max(scored_bytes, 1e-9)
        return {**token_metrics(sums, "tokens"), "bits_per_byte": bits}

    def rates(self, steps: int, seconds: float, batch_size: int) -> dict[str, float]:
        return token_rates(steps, seconds, steps * batch_size * self.block_size)

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        results: dict[str, Any] = {f"test_{k}": v for k, v in test.items()}
        for key in ("loss", "perplexity", "bits_per_byte", "accuracy"):
            results[f"best_valid_{key}"] = None if best is None else best[key]
        results["unigram_bits_per_byte"] = unigram_bits_per_byte(self.data)
        results["block_size"] = self.block_size
        results["corpus"] = self.data.info
        results["tokenizer"] = self.data.tokenizer.describe()
        return results

    def summary(self, results: dict[str, Any]) -> str:
        best = results["best_valid_bits_per_byte"]
        shown = "none" if best is None else f"{best:.4f}"
        return (
            f"test loss {results['test_loss']:.4f} (perplexity {results['test_perplexity']:.3f},"
            f" {results['test_bits_per_byte']:.4f} bits per byte); best valid {shown} bits per "
            f"byte at step {results['best_step']}; unigram baseline "
            f"{results['unigram_bits_per_byte']:.4f} bits per byte"
        )


#: the objective of every task.
OBJECTIVES: dict[str, type[Objective[Any]]] = {
    **dict.fromkeys(CLASSIFICATION_TASKS, Classification),
    "lm": LanguageModelling,
    "mlm": MaskedLanguageModelling,
    "translation": Translation,
    "image-classification": ImageClassification,
    "image-generation": ImageGeneration,
    "text-classification": TextClassification,
    "finetune": FineTuning,
}


def objective_class(task: str) -> type[Objective[Any]]:
    """The objective of ``task`` (a ``ValueError`` naming the tasks otherwise)."""
    if task not in OBJECTIVES:
        raise ValueError(f"task must be one of {', '.join(OBJECTIVES)}, got {task!r}")
    return OBJECTIVES[task]


def objective_of(config: RunConfig) -> type[Objective[Any]]:
    """The objective of a run: its task's, or :class:`~kattn.train.finetune.FineTuningHF` for
    task ``finetune`` from a Hugging Face checkpoint (``model.init_from_hf``)."""
    if config.data.task == "finetune" and config.model.init_from_hf is not None:
        return FineTuningHF
    return objective_class(config.data.task)


def build_objective(config: RunConfig, data: Any) -> Objective[Any]:
    """The objective of ``config`` (:func:`objective_of`) over ``data`` (what its
    :meth:`~Objective.load_data` read)."""
    return objective_of(config)(config, data)
