"""Typed configuration of a training run: the sections of a :class:`RunConfig`, the tasks,
and a saved config read back.

A run is a :class:`RunConfig` of five sections: ``model`` (:class:`ModelConfig`, the network),
``attention`` (:class:`AttentionConfig`, the mechanism and its options; for ``translation``
also the decoder's and the cross-attention's), ``data`` (:class:`DataConfig`, the task and its
data), ``optim`` (:class:`OptimConfig`: AdamW, the schedule, mixed precision, clipping, label
smoothing) and ``train`` (:class:`LoopConfig`: steps, batches, evaluation, checkpoints,
translation's decoding). ``data.task`` is one of :data:`TASKS`:

* the five classification tasks of the Long Range Arena (:data:`CLASSIFICATION_TASKS`:
  ``listops``, ``text``, ``retrieval``, ``image``, ``pathfinder``);
* ``lm`` (causal language modelling) and ``mlm`` (masked language modelling, BERT's
  pre-training);
* ``translation`` (an encoder–decoder on sentence pairs, scored by BLEU at the end);
* the image tasks (:data:`IMAGE_TASKS`): ``image-classification`` (a Vision Transformer) and
  ``image-generation`` (each sub-pixel given those before it, in bits/dim);
* the text tasks (:data:`TEXT_TASKS`): ``text-classification`` (a classifier trained from
  scratch) and ``finetune`` (started from an ``mlm`` run's encoder or a local Hugging Face
  checkpoint).

Each section's docstring says which tasks read which fields; a field set for a task that does
not read it is refused (:mod:`kattn.train.field_checks`) and values out of range are refused
by :mod:`kattn.train.validation`. The dataclass defaults are Skyformer's; the papers' settings
per task are in :mod:`kattn.train.presets`, and :mod:`kattn.train.overrides` applies one and
``section.field=value`` overrides, each value parsed to its field's type by
:func:`coerce_value`. The resolved config is what a run saves as ``config.json``;
:func:`load_config` reads it back, refusing unknown keys and wrong types by name.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the classification tasks of the Long Range Arena.
CLASSIFICATION_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
#: the image tasks (Luo et al. 2021, §4.4 and Appendix A.5).
IMAGE_TASKS = ("image-classification", "image-generation")
#: the text tasks: a classifier trained from scratch, or fine-tuned from an ``mlm`` run.
TEXT_TASKS = ("text-classification", "finetune")
TASKS = (*CLASSIFICATION_TASKS, "lm", "mlm", "translation", *IMAGE_TASKS, *TEXT_TASKS)
SCHEDULES = ("rsqrt", "cosine", "onecycle", "constant", "linear")
AMP_DTYPES = ("bfloat16", "float16")
#: tokens per block of task ``lm`` when ``data.block_size`` is not set.
LM_BLOCK_SIZE = 256
#: tokens per sequence of task ``mlm`` ([CLS] and [SEP] included) when ``data.max_len`` is
#: not set.
MLM_MAX_LEN = 128


@dataclass
class ModelConfig:
    """The encoder and classifier (:class:`kattn.nn.SequenceClassifier`), or the decoder
    (:class:`kattn.nn.CausalLM`) of task ``lm``: ``pooling`` and ``head_hidden`` are the
    classifier's, ``tie_embeddings`` (the output head reuses the token embedding) the
    decoder's. ``patch_size`` (default 4) and ``drop_path`` (DeiT's stochastic depth, rising
    linearly to it over the layers) are the image classifier's
    (:class:`kattn.nn.VisionTransformer`); the image tasks read ``pooling`` ``mean`` as global
    average pooling. ``embedding_norm`` puts a LayerNorm over the token plus position
    embeddings (BERT's, in front of post-LN blocks) in the encoders of the LRA tasks, ``lm``,
    ``mlm`` and the text tasks. ``init_from`` is the ``mlm`` run folder whose encoder starts
    the model of task ``finetune`` (:mod:`kattn.train.finetune`; the encoder's fields are that
    run's). ``init_from_hf`` is instead a local Hugging Face checkpoint that task ``finetune``
    loads as a sequence classifier running the run's mechanism
    (:mod:`kattn.train.finetune_hf`; its config decides the other model fields)."""

    dim: int = 64
    num_layers: int = 2
    num_heads: int = 2
    ffn_dim: int = 128
    pooling: str = "mean"
    positions: str = "learned"
    norm_first: bool = True
    dropout: float = 0.1
    attention_dropout: float = 0.1
    block_skip: bool = False
    out_proj: bool = True
    embedding_std: float = 0.02
    head_hidden: int | None = None
    tie_embeddings: bool = True
    patch_size: int | None = None
    drop_path: float = 0.0
    embedding_norm: bool = False
    init_from: str | None = None
    init_from_hf: str | None = None


@dataclass
class AttentionConfig:
    """The mechanism of every layer and its options (``kattn.build`` names).

    Task ``translation`` chooses the three attentions of its encoder–decoder separately:
    ``name``/``options`` are the encoder's self-attention; ``decoder`` (default ``name``) the
    decoder's causal self-attention, with ``options`` updated by ``decoder_options``; ``cross``
    the cross-attention, with ``options`` updated by ``cross_options`` (default: ``name``
    without its relative positional encoding, ``rpe=None``, since source and target positions
    are not on one axis).
    """

    name: str = "softmax"
    options: dict[str, Any] = field(default_factory=dict)
    decoder: str | None = None
    cross: str | None = None
    decoder_options: dict[str, Any] = field(default_factory=dict)
    cross_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """Where the task's data comes from and how it is read.

    Sequences are cut to ``truncate`` tokens (default: ``max_len``, or the task's length —
    ListOps 2000, Text and Retrieval 4000, Image and Pathfinder 1024) and padded with id 0 to
    ``max_len`` (default: the cut length), the length the model sees. Skyformer cuts ListOps
    to 2000 and pads to 2048. ``path`` None with ListOps means the embedded generated set.

    Task ``lm`` reads a corpus (``path``: a text file, a folder of ``.txt`` files or a WikiText
    folder; None: the embedded standard-library sources), tokenised by ``tokenizer`` (a
    HuggingFace ``.json`` or sentencepiece ``.model`` file; None: UTF-8 bytes), in blocks of
    ``block_size`` tokens (default :data:`LM_BLOCK_SIZE`).

    Task ``mlm`` (masked language modelling) reads a corpus as ``lm`` does, packed into
    sequences of ``max_len`` tokens (default :data:`MLM_MAX_LEN`) as ``[CLS] … [SEP]``, and
    chooses ``mask_prob`` of the tokens to predict (``whole_word_mask``: of the words), of
    which ``mask_token_share`` read [MASK], ``random_token_share`` a random token and the
    rest themselves (BERT's 0.15 and 80/10/10).

    Tasks ``text-classification`` and ``finetune`` read AG News's CSV layout (``path``; None:
    the embedded set of gettext messages labelled by program), or with ``glue`` the GLUE
    task of that name from ``path`` (:mod:`kattn.data.glue`), as ``[CLS] a [SEP] (b [SEP])``
    sequences of ``max_len`` tokens (default :data:`MLM_MAX_LEN`; ``finetune``: the run's).

    Task ``translation`` reads ``src``→``tgt`` pairs (default de→en; ``path``: an IWSLT'14
    folder as fairseq prepares it, or ``PREFIX`` of two aligned files ``PREFIX.src`` and
    ``PREFIX.tgt``; None: the embedded gettext corpus), a joint BPE of ``bpe_size`` ids
    (default 10,000) learnt on the training pairs unless ``tokenizer`` names one, and batches
    of at most ``max_tokens`` padded tokens (default 4,096); ``max_len`` (default 256) is the
    longest source or target in tokens: longer training pairs are left out, longer valid/test
    sources cut (both counted in ``results.json``).

    The image tasks read CIFAR-10/100 python batches, an ImageNet-style folder of class
    folders or the downsampled ImageNet release (``path``; None: the embedded generated
    shapes), resized to ``image_size`` pixels a side (default: the data's size). Task
    ``image-classification`` augments training batches: a random resized crop keeping at
    least ``crop_scale`` of the area (1.0: none), a horizontal ``flip``, ``randaugment``
    ``"N,M"`` (torchvision's RandAugment with N operations of magnitude M out of 10, DeiT's
    ``rand-m9`` scale; None: off), and
    ``mixup`` / ``cutmix`` with Beta(α, α) mixing (0: off).
    """

    task: str = "listops"
    path: str | None = None
    max_len: int | None = None
    truncate: int | None = None
    pad_id_mask: bool = True
    tokenization: str = "official"
    level: str = "curv_contour_length_14"
    block_size: int | None = None
    tokenizer: str | None = None
    src: str | None = None
    tgt: str | None = None
    max_tokens: int | None = None
    bpe_size: int | None = None
    image_size: int | None = None
    crop_scale: float = 0.08
    flip: bool = True
    randaugment: str | None = None
    mixup: float = 0.0
    cutmix: float = 0.0
    mask_prob: float = 0.15
    mask_token_share: float = 0.8
    random_token_share: float = 0.1
    whole_word_mask: bool = False
    glue: str | None = None


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule.

    Schedules: ``onecycle`` (PyTorch's ``OneCycleLR``, linear anneal, warm-up fraction
    ``warmup_steps / steps``, β₁ cycled 0.95→0.85→0.95: the Skyformer code), ``rsqrt``
    (``lr · min(1, t/w) / √max(t, w)``, LRA and the KL-Transformer: the peak is ``lr/√w``),
    ``cosine`` (linear warm-up to ``lr``, cosine decay to 0), ``constant`` (after warm-up),
    ``linear`` (linear warm-up to ``lr``, then linear decay to 0 at the last step: BERT and
    Luo et al. 2021's pre-training).
    ``accumulate`` micro-batches make one optimiser step of ``train.batch_size`` examples.
    ``amp`` autocasts CUDA runs to ``amp_dtype`` (float16 with a gradient scaler); CPU runs
    are fp32. ``label_smoothing`` (tasks ``translation`` and ``image-classification``) mixes
    the one-hot target with the uniform distribution in the training loss (Szegedy et al.
    2016; 0.1 in Vaswani et al. 2017 and Touvron et al. 2021).
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    schedule: str = "onecycle"
    warmup_steps: int = 1000
    grad_clip_value: float | None = 1.0
    grad_clip_norm: float | None = None
    accumulate: int = 1
    amp: bool = True
    amp_dtype: str = "bfloat16"
    label_smoothing: float = 0.0


@dataclass
class LoopConfig:
    """Steps, batches, evaluation and checkpoints.

    ``steps`` counts optimiser steps of ``batch_size`` examples (across all processes).
    Every ``eval_every`` steps the validation split is evaluated (its first ``eval_batches``
    batches, or all of it) and the run checkpointed; the best validation accuracy is kept as
    the best checkpoint once ``best_after`` of the steps are done (Skyformer: 0.2).
    ``early_stop`` stops after that many evaluations without improvement.

    Task ``translation`` ends with BLEU on the first ``bleu_examples`` (all by default) pairs
    of valid and test, decoded by beam search of ``beam_size`` hypotheses (1: greedy) with
    fairseq's ``length_penalty`` and at most ``max_len_a · source length + max_len_b`` tokens.
    """

    steps: int = 50000
    batch_size: int = 32
    eval_every: int = 500
    eval_batches: int | None = None
    log_every: int = 50
    seed: int = 42
    device: str = "auto"
    early_stop: int | None = None
    best_after: float = 0.0
    beam_size: int = 5
    length_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    bleu_examples: int | None = None


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """The config with ``values`` (as :meth:`to_dict` writes them), each checked against
        its field's type; unknown keys and wrong types raise naming the key."""
        sections = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(values, Mapping):
            raise ValueError(
                f"a config is a JSON object of sections ({', '.join(sections)}), "
                f"got {_json_kind(values)}"
            )
        config = cls()
        for section, entries in values.items():
            part = config_section(config, section)
            if not isinstance(entries, Mapping):
                raise ValueError(
                    f"config section {section!r} must be a JSON object of its fields, "
                    f"got {_json_kind(entries)}"
                )
            for key, value in entries.items():
                value = coerce_value(config_field(part, section, key), value, f"{section}.{key}")
                setattr(part, key, dict(value) if isinstance(value, dict) else value)
        return config


def load_run_config(run: str | Path, *, label: str | None = None) -> RunConfig:
    """The config of the run folder ``run`` (its ``config.json``).

    Raises:
        ValueError: ``run`` holds no config.json (the message names it as ``label``, by
            default the folder), or the file is malformed (:func:`load_config`).
    """
    path = Path(run) / "config.json"
    if not path.is_file():
        raise ValueError(f"{label or run} is not a run folder (no config.json)")
    return load_config(path)


def load_config(path: str | Path) -> RunConfig:
    """The config saved at ``path`` (a run's ``config.json``).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is not JSON, or a key or type is wrong; the message names the
            file (and the key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected a config.json (a JSON file)")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            f"expected a config as kattn train writes it"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} cannot be read as a config: {err}") from None
    try:
        return RunConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    kinds.update({int: "a number", float: "a number", type(None): "null"})
    return kinds.get(type(value), type(value).__name__)


def config_section(config: RunConfig, section: str) -> Any:
    """Section ``section`` of ``config`` (ValueError naming the sections otherwise)."""
    names = [f.name for f in dataclasses.fields(config)]
    if section not in names:
        raise ValueError(f"unknown config section {section!r}; sections: {', '.join(names)}")
    return getattr(config, section)


def config_field(part: Any, section: str, name: str) -> dataclasses.Field[Any]:
    """Field ``name`` of section ``part`` (ValueError naming its fields otherwise)."""
    fields = {f.name: f for f in dataclasses.fields(part)}
    if name not in fields:
        raise ValueError(
            f"unknown config key {section}.{name}; {section} has: {', '.join(sorted(fields))}"
        )
    return fields[name]


def coerce_value(spec: dataclasses.Field[Any], value: Any, key: str) -> Any:
    """``value`` as field ``spec`` takes it (an int where a float goes), else ValueError
    naming ``key`` and the types the field allows."""
    hint = typing.get_type_hints(_owner(spec))[spec.name]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if union else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
        if typing.get_origin(kind) is dict and isinstance(value, dict):
            return value
    names = " or ".join(
        "null" if k is type(None) else getattr(k, "__name__", str(k)) for k in allowed
    )
    raise ValueError(f"{key} must be {names}, got {value!r}")


def _owner(spec: dataclasses.Field[Any]) -> type:
    for cls in (ModelConfig, AttentionConfig, DataConfig, OptimConfig, LoopConfig):
        if spec in dataclasses.fields(cls):
            return cls
    raise LookupError(spec.name)
