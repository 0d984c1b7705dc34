"""The model of task ``finetune`` started from a local Hugging Face checkpoint
(``model.init_from_hf``, ``kattn train --task finetune --from-hf DIR``; the objective is
:class:`~kattn.train.finetune.FineTuningHF`): the checkpoint loaded as
``AutoModelForSequenceClassification`` with the run's kattn mechanism in every attention
layer (:func:`kattn.hf.from_pretrained`), trained by kattn's one loop.

This is the setting of Yorsh (2022, §4.3.2.2, Tables 4.2-4.3), who fine-tunes the Hugging
Face BERT-base configuration on AG News with linear attentions (Feedforward kernels,
SimpleTRON) in place of softmax. Everything but the model and the tokenizer is
:class:`~kattn.train.finetune.TextClassification`'s: the data and hold-out, the loss, the
metrics, the best checkpoint, ``results.json``.
The classifier is a new head of ``num_labels`` outputs (``problem_type`` regression for
STS-B); padding goes to the model as its ``attention_mask``, so padded keys count nowhere.

The run folder keeps, in :data:`~kattn.train.finetune_hf_data.RUN_FILES`, the checkpoint's
tokenizer and config (written when the run starts), so resuming and ``kattn eval`` need
the run folder and the data, not the checkpoint, and
:func:`kattn.train.load_trained_model` the run folder alone (the saved config holds the
task's head: :func:`run_classifier`); at the end the best model is written there too by
``save_pretrained``, for :func:`kattn.hf.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from ..attention.base import Attention
from ..hf import from_pretrained, use
from .config import RunConfig
from .finetune_hf_data import RUN_FILES, HFTaskData


class HFClassifier(nn.Module):
    """A transformers sequence classifier as kattn's loop trains it: the logits of token ids,
    padding passed as the attention mask, and the kattn mechanisms' penalties.

    ``model`` runs its kattn mechanism already (:func:`kattn.hf.from_pretrained` or
    :func:`kattn.hf.use`): its kattn modules are listed once, here, not at every step.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.hf = model
        # a tuple, not a ModuleList: the modules stay registered under self.hf alone
        self.mechanisms = tuple(m for m in model.modules() if isinstance(m, Attention))

    def forward(
        self, tokens: Tensor, padding: Tensor | None = None, types: Tensor | None = None
    ) -> Tensor:
        """``(B, num_labels)`` logits of ``tokens`` (B, L); ``padding`` (B, L) is True at
        padded positions, ``types`` the segment ids."""
        mask = None if padding is None else (~padding).long()
        extra = {} if types is None else {"token_type_ids": types}
        return self.hf(input_ids=tokens, attention_mask=mask, **extra).logits

    def regularization_loss(self) -> Tensor:
        """Sum of the kattn mechanisms' penalties (0 for most mechanisms)."""
        total = torch.zeros((), device=next(self.parameters()).device)
        for module in self.mechanisms:
            total = total + module.regularization_loss()
        return total


def _problem(data: HFTaskData) -> dict[str, Any]:
    """The head's config: outputs, problem type, and the task's class names in kattn's order
    (so that the saved model names its outputs)."""
    kind = "regression" if data.regression else "single_label_classification"
    names = list(data.classes) if data.classes is not None else ["score"]
    return {
        "num_labels": data.outputs, "problem_type": kind,
        "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)},
    }  # fmt: skip


def check_start_head(start: str, data: HFTaskData) -> None:
    """Refuse a checkpoint that is already a sequence classifier over other labels than the
    task's (or labels in another order): transformers would keep its head, whose outputs mean
    its own classes, under kattn's class numbers."""
    config = AutoConfig.from_pretrained(start)
    if not any(a.endswith("ForSequenceClassification") for a in config.architectures or ()):
        return
    theirs = [config.id2label[i] for i in sorted(config.id2label)]
    ours = list(_problem(data)["id2label"].values())
    if len(theirs) == len(ours) and theirs != ours:
        raise ValueError(
            f"the checkpoint {start} is already a sequence classifier over the labels "
            f"{theirs}, and this task's labels are {ours} in this order: its head would be "
            "kept with another meaning. Fine-tune from its base model (without the head), or "
            "give the checkpoint's config these labels if they are the same classes"
        )


def hf_classifier(config: RunConfig, data: HFTaskData) -> HFClassifier:
    """The classifier of a run: the checkpoint's weights and a new head (a new run), or
    :func:`run_classifier` (a resumed run, whose checkpoint then loads)."""
    if data.files is not None:
        return run_classifier(config, data.files)
    start = config.model.init_from_hf or ""  # checked when its tokenizer was read
    check_start_head(start, data)
    model = from_pretrained(
        AutoModelForSequenceClassification, start, config.attention.name,
        options=dict(config.attention.options), dtype=torch.float32,
        ignore_mismatched_sizes=True, **_problem(data),
    )  # fmt: skip
    return HFClassifier(model)


def run_classifier(config: RunConfig, files: Path) -> HFClassifier:
    """The classifier of a run folder's :data:`~kattn.train.finetune_hf_data.RUN_FILES`
    (``files``): its saved config, which holds the task's head, with fresh weights and the
    run's mechanism, for a checkpoint of the run to load; the task's data is not read."""
    hf_config = AutoConfig.from_pretrained(files)
    model = AutoModelForSequenceClassification.from_config(hf_config, dtype=torch.float32)
    use(model, config.attention.name, **config.attention.options)
    return HFClassifier(model)


def write_hf_run_files(data: HFTaskData, start: str, run_dir: Path) -> Path:
    """Write checkpoint ``start``'s tokenizer and config (with the task's head) into
    ``run_dir``'s :data:`~kattn.train.finetune_hf_data.RUN_FILES` folder; return it."""
    files = Path(run_dir) / RUN_FILES
    data.tokenizer.save_pretrained(files)
    AutoConfig.from_pretrained(start, **_problem(data)).save_pretrained(files)
    return files


def save_hf_model(model: nn.Module, tokenizer: Any, files: Path) -> None:
    """Write the transformers model of ``model`` (an :class:`HFClassifier`) and
    ``tokenizer`` into ``files`` with ``save_pretrained``."""
    if not isinstance(model, HFClassifier):
        raise TypeError(f"model must be an HFClassifier, got {type(model).__name__}")
    model.hf.save_pretrained(files)  # type: ignore[operator]
    tokenizer.save_pretrained(files)
