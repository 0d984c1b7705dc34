"""Tasks ``text-classification`` and ``finetune``: a
:class:`~kattn.nn.text_classifier.TextClassifier` over ``[CLS] a [SEP] (b [SEP])`` sequences
(:mod:`kattn.train.finetune_data`), trained from scratch or started from the encoder of an
``mlm`` run (``model.init_from``).

Both build the encoder of :func:`~kattn.train.mlm.build_masked_lm` with RoBERTa's head on the
[CLS] output, so a fine-tuned and a from-scratch run differ only in where the encoder starts.
The loss is the cross-entropy (the mean squared error for STS-B's scores); the best
checkpoint has the highest validation accuracy (the lowest validation loss for regression).
At the end the best model's predictions give the task's official metrics
(:mod:`kattn.train.glue_metrics`) on valid and test (MNLI: also mismatched), beside those of
the majority (for regression: mean) baseline.

A fine-tuned model's encoder fields are its pre-trained run's (:data:`ENCODER_FIELDS`):
:func:`adopt_start` copies them into a config, and a config whose fields differ is refused
(:mod:`kattn.train.finetune_start`). :class:`FineTuningHF` starts from a Hugging Face
checkpoint instead (``model.init_from_hf``; :mod:`kattn.train.finetune_hf`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import Tokenizer, load_tokenizer
from ..data.mlm_vocab import mlm_vocab
from ..nn.text_classifier import TextClassifier
from .config import RunConfig
from .field_checks import refuse_image_fields, refuse_translation_fields, refuse_unread_data_fields
from .finetune_data import TextTaskData, load_text_task
from .finetune_start import (
    ENCODER_FIELDS,
    adopt_start,
    check_start,
    start_checkpoint,
    start_config,
    start_encoder_state,
)
from .glue_metrics import accuracy, baseline_predictions, task_metrics
from .mlm import build_masked_lm
from .mlm_data import mlm_max_len
from .objective_base import ClassAccuracy, Objective, shuffled_index
from .tasks import run_tokenizer

if TYPE_CHECKING:
    from .finetune_hf_data import HFTaskData

__all__ = ["ENCODER_FIELDS", "FineTuning", "FineTuningHF", "TextClassification", "adopt_hf",
           "adopt_start", "check_start", "start_config", "start_encoder_state",
           "text_classifier"]  # fmt: skip


class TextClassification(ClassAccuracy, Objective[TextTaskData]):
    """A text classifier (or regressor) trained from scratch; see the module docstring."""

    task = "text-classification"
    count_key = "examples"
    embedded_data = "the embedded set of gettext messages by program"
    unit = "examples"
    paper_preset = "small"
    summary_keys = ("task", "mechanism", "steps", "test_metrics", "baseline_test_metrics",
                    "best_valid_accuracy", "best_valid_loss", "wall_time_s",
                    "steps_per_s")  # fmt: skip

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        refuse_translation_fields(config)
        refuse_image_fields(config)
        # the masking fields and model.init_from(_hf) are refused by field_checks'
        # refuse_text_fields, which validation runs for every task
        refuse_unread_data_fields(config, ("block_size", "truncate"), ": set data.max_len")

    def __init__(self, config: RunConfig, data: TextTaskData) -> None:
        super().__init__(config, data)
        self.task = config.data.task
        self.metric_names = data.metrics
        if data.regression:
            self.best_metric, self.higher_is_better = "loss", False
            self.shown: tuple[str, ...] = ("loss", "steps_per_s")
        else:
            self.best_metric, self.higher_is_better = "accuracy", True
            self.shown = ("loss", "accuracy", "steps_per_s")

    @classmethod
    def tokenizer(cls, config: RunConfig, run_dir: Path | None) -> Tokenizer:
        """The run folder's copy of the tokenizer, else the one ``data.tokenizer`` names."""
        if run_dir is not None:
            return run_tokenizer(run_dir, config)
        return load_tokenizer(config.data.tokenizer)

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> TextTaskData:
        tokenizer = cls.tokenizer(config, run_dir)
        return load_text_task(config, tokenizer, mlm_vocab(tokenizer), mlm_max_len(config))

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The classifier, sized by the task's data (read again) and the run's tokenizer."""
        data = cls.load_data(config, run_dir)
        return text_classifier(config, data), None

    def build_model(self, config: RunConfig) -> nn.Module:
        return text_classifier(config, self.data)

    def write_run_files(self, run_dir: Path) -> None:
        """The tokenizer's file: the run folder alone gives the model."""
        self.data.tokenizer.save(run_dir)

    def size(self, split: str) -> int:
        return len(self.data.splits[split])

    def eval_index(self, split: str, limit: int | None, seed: int) -> Tensor:
        return shuffled_index(self.size(split), limit, seed)

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        """Rows ``index`` of ``split``, cut after the longest one (padding never counts)."""
        rows = self.data.splits[split]
        lengths = rows.lengths[index]
        tokens = rows.tokens[index, : int(lengths.max())].long()
        batch = {"tokens": tokens, "labels": rows.labels[index]}
        padding = torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]
        if padding.any():  # decided on the CPU: no device sync in the forward
            batch["padding"] = padding
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["tokens"], batch.get("padding"))

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        if self.data.regression:
            return F.mse_loss(logits.float()[:, 0], batch["labels"].float(), reduction=reduction)
        return F.cross_entropy(logits.float(), batch["labels"], reduction=reduction)

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        """:class:`ClassAccuracy`'s counts; no correct ones for regression."""
        if self.data.regression:
            return 0, len(batch["labels"])
        return super().counts(logits, batch)

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        """:class:`ClassAccuracy`'s metrics, without accuracy for regression."""
        values = super().metrics(sums, split)
        if self.data.regression:
            del values["accuracy"]
        return values

    def predictions(self, model: nn.Module, split: str, device: torch.device) -> Tensor:
        """The best model's predicted classes (or scores) on every example of ``split``."""
        model.eval()
        out = []
        with torch.no_grad():
            for chunk in torch.arange(self.size(split)).split(256):
                logits = self.forward(model, self.batch(split, chunk, device)).float().cpu()
                out.append(logits[:, 0] if self.data.regression else logits.argmax(-1))
        return torch.cat(out)

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """The official metrics of the best model and of the baseline on every evaluated
        split."""
        train_labels = self.data.splits["train"].labels
        results: dict[str, Any] = {"metric_names": list(self.metric_names)}
        for split, rows in self.data.splits.items():
            if split == "train":
                continue
            pred = self.predictions(model, split, device)
            base = baseline_predictions(train_labels, len(rows), self.data.regression)
            results[f"{split}_metrics"] = task_metrics(self.metric_names, pred, rows.labels)
            results[f"baseline_{split}_metrics"] = task_metrics(
                self.metric_names, base, rows.labels
            )
        return results

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        regression = self.data.regression
        return {
            "test_loss": test["loss"],
            "test_accuracy": None if regression else test["accuracy"],
            "test_examples": test["examples"],
            "best_valid_loss": None if best is None else best["loss"],
            "best_valid_accuracy": None if best is None or regression else best["accuracy"],
            "majority_baseline": None if regression else self._majority_baseline(),
            "init_from": None,
            "data": self.data.info,
        }

    def _majority_baseline(self) -> float:
        """Test accuracy of always answering the most frequent training class."""
        train, test = self.data.splits["train"].labels, self.data.splits["test"].labels
        return accuracy(baseline_predictions(train, len(test), regression=False), test)

    def summary(self, results: dict[str, Any]) -> str:
        head = self.metric_names[0]
        test = results.get("test_metrics", {}).get(head)
        base = results.get("baseline_test_metrics", {}).get(head)
        shown, baseline = (
            "none" if v is None or not math.isfinite(v) else f"{v:.4f}" for v in (test, base)
        )
        return (
            f"test {head} {shown} (best checkpoint at step {results['best_step']}); "
            f"{'mean' if self.data.regression else 'majority'} baseline {baseline}"
        )


class FineTuning(TextClassification):
    """:class:`TextClassification` whose encoder starts from an ``mlm`` run
    (``model.init_from``). A run with ``model.init_from_hf`` (a Hugging Face checkpoint) is a
    :class:`FineTuningHF` (``objectives.objective_of`` picks it)."""

    task = "finetune"

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        TextClassification.check_data_fields(config)
        check_start(config)

    @classmethod
    def tokenizer(cls, config: RunConfig, run_dir: Path | None) -> Tokenizer:
        """The run folder's copy of the tokenizer, else the pre-trained run's."""
        start = Path(config.model.init_from or "")
        return run_tokenizer(run_dir if run_dir is not None else start, config)

    def build_model(self, config: RunConfig) -> nn.Module:
        model = text_classifier(config, self.data)
        model.encoder.load_state_dict(start_encoder_state(start_checkpoint(self.init_from)))
        return model

    def __init__(self, config: RunConfig, data: TextTaskData) -> None:
        super().__init__(config, data)
        self.init_from = config.model.init_from or ""

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        start = start_checkpoint(self.init_from)
        return {**super().results(test, best), "init_from": str(start)}


class FineTuningHF(TextClassification):
    """Task ``finetune`` from a local Hugging Face checkpoint (``model.init_from_hf``): its
    model, a transformers sequence classifier running the run's mechanism, and its tokenizer
    (:mod:`kattn.train.finetune_hf`); the rest is :class:`TextClassification`'s."""

    task = "finetune"
    if TYPE_CHECKING:
        data: HFTaskData

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        TextClassification.check_data_fields(config)
        _hf_data().check_hf_start(config)

    def __init__(self, config: RunConfig, data: TextTaskData) -> None:
        super().__init__(config, data)
        self.init_from = config.model.init_from_hf or ""
        self.run_files = getattr(data, "files", None)

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> TextTaskData:
        return _hf_data().load_hf_task(config, run_dir)

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Tokenizer | None]:
        """The classifier of the Hugging Face config saved in the run folder (its ``hf/``,
        which holds the task's head): the task's data is not read."""
        return _hf().run_classifier(config, _hf_data().run_files(run_dir)), None

    def build_model(self, config: RunConfig) -> nn.Module:
        return _hf().hf_classifier(config, self.data)

    def write_run_files(self, run_dir: Path) -> None:
        """The checkpoint's tokenizer and config (with this task's head) in ``run_dir/hf``."""
        self.run_files = _hf().write_hf_run_files(self.data, self.init_from, run_dir)

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        """As :class:`TextClassification`'s, with the segment ids where the tokenizer gives
        them."""
        batch = super().batch(split, index, device)
        types = getattr(self.data.splits[split], "types", None)
        if types is not None:
            batch["types"] = types[index, : batch["tokens"].shape[1]].long().to(device)
        return batch

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(batch["tokens"], batch.get("padding"), batch.get("types"))

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """The official metrics; and the best model written by ``save_pretrained`` (with the
        tokenizer) into the run folder's ``hf/``."""
        results = super().final_results(model, device)
        if self.run_files is not None:
            _hf().save_hf_model(model, self.data.tokenizer, self.run_files)
            results["hf_model"] = str(self.run_files)
        return results

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        return {**super().results(test, best), "init_from_hf": self.init_from}


def adopt_hf(config: RunConfig, given: set[str]) -> RunConfig:
    """``config`` with the model fields of its Hugging Face checkpoint, except those in
    ``given``; then checked (:func:`kattn.train.finetune_hf_data.adopt_hf`)."""
    return _hf_data().adopt_hf(config, given)


def _hf_data() -> Any:
    """:mod:`kattn.train.finetune_hf_data` (an ImportError naming the ``hf`` extra without
    transformers)."""
    from .. import hf  # noqa: F401
    from . import finetune_hf_data

    return finetune_hf_data


def _hf() -> Any:
    """:mod:`kattn.train.finetune_hf` (imported when a run needs it)."""
    _hf_data()
    from . import finetune_hf

    return finetune_hf


def text_classifier(config: RunConfig, data: TextTaskData) -> TextClassifier:
    """The classifier of ``config.model`` (the encoder of task mlm's model) over ``data``."""
    if data.vocab is None:
        raise ValueError("data: a kattn classifier needs a kattn vocabulary, these data have none")
    encoder = build_masked_lm(config, data.vocab.vocab_size).encoder
    m = config.model
    return TextClassifier(
        encoder, data.outputs, hidden=m.head_hidden, dropout=m.dropout, pooling=m.pooling
    )
