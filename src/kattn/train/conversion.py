"""A trained translation run's attentions converted to kernelized attention without
fine-tuning, and the converted model scored (Luo et al. 2021, §4.5, Figure 2).

Luo et al. train Transformers with standard or normalised softmax attention, with or without
a relative positional encoding, then replace every softmax by PRF kernelized attention (their
eq. 5) keeping all the weights: normalised attention loses little, standard attention much.
:func:`convert_run` does that to a run folder of ``kattn train --task translation``: the
encoder's self-attention, the decoder's causal self-attention and the cross-attention are each
converted by :func:`kattn.convert_attention` to their kernelized counterpart
(:func:`conversion_target`) or to a mechanism named by the caller; :func:`evaluate_translation`
gives the validation loss and BLEU of the model before and after; :func:`write_converted_run`
writes the converted model as a run folder that ``kattn translate`` reads.
"""

from __future__ import annotations

import copy
import fnmatch
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention.rpe_options import encoding_options
from ..nn.convert import ConversionReport, ModuleConversion, convert_attention
from ..nn.multihead import MultiheadAttention
from ..registry import MECHANISMS
from .bleu import Decoding
from .checkpoint import BEST, LAST, load_checkpoint, save_checkpoint, save_json
from .config import RunConfig, load_run_config
from .objective_base import SPLITS
from .trained import load_trained_model
from .translation import Translation, attention_plan
from .translation_data import TOKENIZER_FILE, TranslationData

#: the three attentions of the encoder–decoder (as :func:`attention_plan` names them) → the
#: qualified names of their modules in :class:`~kattn.nn.Seq2Seq`.
KINDS: dict[str, str] = {
    "encoder": "encoder.layers.*",
    "decoder": "layers.*.self_attn",
    "cross": "layers.*.cross_attn",
}
#: options a converted attention keeps from the trained one (besides the encoding's own).
_KEPT = ("rpe", "scale", "normalize_qk", "temperature", "learn_temperature")


def conversion_target(
    mechanism: str,
    options: Mapping[str, Any],
    num_features: int | None = None,
    feature_options: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The kernelized counterpart of a trained softmax attention (Luo et al. 2021, §4.5):
    its PRF estimate (their eq. 5) with the same logit scale, q/k normalisation, temperature
    and relative encoding.

    ``softmax`` → ``performer``; ``softmax_rpe`` → ``prf_rpe`` (``performer`` when it has no
    encoding, as the cross-attention); ``normalized_softmax`` → ``kernelized`` with
    ``feature_map="prf"``, ``normalize_qk=True``; with an encoding → ``nprf_rpe``; the
    temperature (``learn_temperature=True`` by default) and the encoding options are kept.

    Args:
        mechanism, options: the trained attention (options as its run's plan gives them).
        num_features: M, the random features (None: the mechanism's default).
        feature_options: more options of the feature map (e.g. ``sampling="gaussian"``).

    Returns:
        ``(name, options)`` for :func:`kattn.convert_attention`.

    Raises:
        ValueError: ``mechanism`` is not one of the three softmax attentions.
    """
    entry = MECHANISMS.get(mechanism)
    full = {**entry.defaults, **options}
    if mechanism == "softmax":
        name, target = "performer", {k: full[k] for k in ("scale",) if k in full}
    elif mechanism in ("softmax_rpe", "normalized_softmax"):
        target = {**{k: full[k] for k in _KEPT if k in full}, **_encoding(full)}
        normalised = bool(full.get("normalize_qk", False))
        if full.get("rpe") is not None:
            name = "nprf_rpe" if normalised else "prf_rpe"
        else:
            name = "kernelized" if normalised else "performer"
        if name == "kernelized":
            target["feature_map"] = "prf"
        if normalised:
            target["learn_temperature"] = full.get("learn_temperature", True)
    else:
        raise ValueError(
            f"conversion_target: {mechanism!r} has no kernelized counterpart here (softmax, "
            f"softmax_rpe and normalized_softmax have); name the mechanism to convert to instead"
        )
    if num_features is not None:
        target["num_features"] = num_features
    target.update(feature_options or {})
    return name, target


def _encoding(options: Mapping[str, Any]) -> dict[str, Any]:
    """``rpe`` and the options of its encoding, as ``options`` holds them."""
    names = encoding_options(options.get("rpe"))
    return {k: v for k, v in options.items() if k == "rpe" or k in names}


@dataclass(frozen=True)
class RunConversion:
    """What :func:`convert_run` did to a run's model.

    Attributes:
        run: the run folder read; checkpoint: ``best`` or ``last``; step: its step.
        seed: the seed of the random features drawn.
        trained: kind (``encoder``, ``decoder``, ``cross``) → the trained mechanism and
            options (the run's attention plan).
        converted: kind → the new mechanism and options, for the kinds whose every module
            was converted; kinds left as trained keep theirs; kinds converted in part are
            absent (such a model has no run config, see :func:`converted_config`).
        modules: the per-module report of :func:`kattn.convert_attention`.
    """

    run: Path
    checkpoint: str
    step: int | None
    seed: int
    trained: dict[str, tuple[str, dict[str, Any]]]
    converted: dict[str, tuple[str, dict[str, Any]]]
    modules: ConversionReport = field(repr=False)

    def kind_lines(self) -> list[str]:
        """One line per converted attention kind: mechanisms and what was kept."""
        lines = []
        for kind in KINDS:
            mine = [m for m in self.modules if fnmatch.fnmatchcase(m.name, KINDS[kind])]
            if mine:
                count = f"{len(mine)} module{'s' * (len(mine) > 1)}"
                lines.append(f"{kind} ({count}): {_summary(mine)}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run),
            "checkpoint": self.checkpoint,
            "step": self.step,
            "seed": self.seed,
            "trained": {k: {"mechanism": n, "options": o} for k, (n, o) in self.trained.items()},
            "converted": {
                k: {"mechanism": n, "options": o} for k, (n, o) in self.converted.items()
            },
            "modules": [
                {"name": m.name, "source": m.source, "target": m.target, "kept": list(m.kept),
                 "initialised": list(m.initialised), "dropped": list(m.dropped)}
                for m in self.modules
            ],
        }  # fmt: skip


def _summary(modules: list[ModuleConversion]) -> str:
    """``source -> target`` and the entries kept, initialised and dropped in any module."""

    def names(key: str) -> str:
        return ", ".join(sorted({e for m in modules for e in getattr(m, key)})) or "-"

    sources = "/".join(sorted({m.source for m in modules}))
    return (
        f"{sources} -> {modules[0].target}; kept {names('kept')}; initialised "
        f"{names('initialised')}; dropped {names('dropped')}"
    )


def convert_run(
    run_dir: str | Path,
    to: str | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    only: str | None = None,
    checkpoint: str = "best",
    device: str = "cpu",
    seed: int = 0,
    strict: bool = True,
) -> tuple[nn.Module, RunConversion]:
    """The model of a translation run with its attentions converted, without fine-tuning.

    Args:
        run_dir: a run folder of ``kattn train --task translation``.
        to: the mechanism of every converted attention, built with each one's relative
            encoding and temperature options plus ``options``; None: each attention's
            :func:`conversion_target` (``options`` added to it, e.g. ``num_features``).
        only: convert only the ``MultiheadAttention`` modules whose qualified name matches
            this ``fnmatch`` pattern (``encoder.*``, ``layers.*.cross_attn``).
        checkpoint: ``best`` or ``last``.
        device: where the model is put (``auto``: CUDA when available).
        seed: seeds the random features drawn, so a conversion is reproducible.
        strict: see :func:`kattn.convert_attention` (False converts what it would refuse).

    Returns:
        The converted model (eval mode) and the :class:`RunConversion`.

    Raises:
        ValueError: not a translation run, nothing selected, or a refused conversion.
    """
    run = Path(run_dir)
    config = _translation_config(run)
    model, _, _ = load_trained_model(run, checkpoint, device)
    plan = attention_plan(config)
    trained = {k: (plan[f"{k}_attention"], dict(plan[f"{k}_options"])) for k in KINDS}
    names = [n for n, m in model.named_modules() if isinstance(m, MultiheadAttention)]
    converted: dict[str, tuple[str, dict[str, Any]]] = {}
    reports: list[ModuleConversion] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for kind, pattern in KINDS.items():
            members = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            chosen = [n for n in members if only is None or fnmatch.fnmatchcase(n, only)]
            if not chosen:
                converted[kind] = trained[kind]
                continue
            mechanism, kind_options = trained[kind]
            if to is None:
                target = conversion_target(mechanism, kind_options, feature_options=options)
            else:
                target = (to, {**_encoding(kind_options), **(options or {})})
            report = convert_attention(
                model, target[0], only=_named(chosen), strict=strict, **target[1]
            )
            reports.extend(report)
            if len(chosen) == len(members):
                converted[kind] = target
    if not reports:
        raise ValueError(f"--only {only!r} selects none of the attentions of {run}: {names}")
    step = _checkpoint_step(run, checkpoint)
    result = RunConversion(
        run, checkpoint, step, seed, trained, converted, ConversionReport(tuple(reports))
    )
    return model.eval(), result


def _named(names: list[str]) -> Callable[[str, MultiheadAttention], bool]:
    """A ``convert_attention`` selection of the modules with these qualified names."""
    chosen = frozenset(names)
    return lambda name, _module: name in chosen


def _translation_config(run: Path) -> RunConfig:
    config = load_run_config(run)
    if config.data.task != "translation":
        raise NotImplementedError(
            f"{run} is a {config.data.task} run: converting a trained model's attention is "
            f"implemented for translation runs (kattn train --task translation) only; for "
            f"other models call kattn.convert_attention on the model"
        )
    return config


def _checkpoint_step(run: Path, checkpoint: str) -> int | None:
    saved = load_checkpoint(run / (BEST if checkpoint == "best" else LAST))
    if checkpoint == "best":
        return saved.get("step")
    return (saved.get("state") or {}).get("step")


def converted_config(config: RunConfig, conversion: RunConversion) -> RunConfig:
    """The run config of the converted model: ``config`` with the attentions of
    ``conversion`` (each kind's mechanism and full options, so the plan is exactly it).

    Raises:
        ValueError: an attention kind was converted in part (``only`` selected some of its
            layers), which a run config cannot say.
    """
    partial = [k for k in KINDS if k not in conversion.converted]
    if partial:
        raise ValueError(
            f"the {', '.join(partial)} attention was converted in some layers only: a run "
            f"config has one mechanism per attention kind, so this model cannot be written as "
            f"a run folder (select whole kinds, e.g. only='layers.*.cross_attn')"
        )
    new = copy.deepcopy(config)
    (enc, enc_opts), (dec, dec_opts), (cross, cross_opts) = (conversion.converted[k] for k in KINDS)
    a = new.attention
    a.name, a.options = enc, dict(enc_opts)
    a.decoder, a.decoder_options = dec, dict(dec_opts)
    a.cross, a.cross_options = cross, dict(cross_opts)
    plan = attention_plan(new)
    for kind in KINDS:
        name, options = conversion.converted[kind]
        written = plan[f"{kind}_attention"], plan[f"{kind}_options"]
        if written[0] != name or _resolved(*written) != _resolved(name, options):
            raise ValueError(
                f"the {kind} attention's options {options} cannot be written beside the "
                f"encoder's {enc_opts} in one run config"
            )
    return new


def _resolved(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return {**MECHANISMS.get(name).defaults, **options}


def write_converted_run(
    model: nn.Module, conversion: RunConversion, out: str | Path, metrics: Any = None
) -> Path:
    """Write the converted model as a run folder ``out``: ``config.json`` with the new
    attentions, ``best.pt``, the vocabulary and ``conversion.json`` (the report, and
    ``metrics`` when given); ``kattn translate --run OUT`` then uses it.

    Raises:
        ValueError: ``out`` already holds a run, or the conversion has no run config.
    """
    out = Path(out)
    if (out / "config.json").exists() or (out / BEST).exists():
        raise ValueError(f"{out} already holds a run; choose another --out")
    config = converted_config(_translation_config(conversion.run), conversion)
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "config.json", config.to_dict())
    save_checkpoint(out / BEST, {"model": model.state_dict(), "step": conversion.step})
    shutil.copyfile(conversion.run / TOKENIZER_FILE, out / TOKENIZER_FILE)
    save_json(out / "conversion.json", {**conversion.as_dict(), "metrics": metrics})
    return out


def load_run_data(run_dir: str | Path) -> tuple[RunConfig, TranslationData]:
    """A translation run's config and its data (pairs as ids with the run's vocabulary)."""
    run = Path(run_dir)
    config = _translation_config(run)
    return config, Translation.load_data(config, run)


@torch.no_grad()
def evaluate_translation(
    model: nn.Module,
    config: RunConfig,
    data: TranslationData,
    split: str = "valid",
    *,
    bleu_examples: int | None = None,
    decoding: Decoding | None = None,
) -> dict[str, Any]:
    """The loss of ``model`` on all of ``split`` and the BLEU of its translations of the
    first ``bleu_examples`` pairs (None: all; 0: no BLEU), with the batches, loss and BLEU
    of the :class:`~kattn.train.translation.Translation` objective.

    Returns:
        ``loss`` (negative log-likelihood, nats per target token), ``perplexity``,
        ``accuracy``, ``tokens``, and with BLEU ``bleu``, ``copy_source_bleu``,
        ``bleu_sentences``, ``decoding``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if bleu_examples is not None and bleu_examples < 0:
        raise ValueError(f"bleu_examples must be ≥ 0 (0: no BLEU), got {bleu_examples}")
    objective = Translation(config, data)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = [0.0, 0.0, 0.0]
    chunk = max(1, config.train.batch_size // config.optim.accumulate)
    for index in objective.eval_index(split, None, config.train.seed).split(chunk):
        batch = objective.batch(split, index, device)
        logits = objective.forward(model, batch).float()
        correct, n = objective.counts(logits, batch)
        sums[0] += objective.loss(logits, batch, reduction="sum").item()
        sums[1] += correct
        sums[2] += n
    result: dict[str, Any] = dict(objective.metrics(sums, split))
    if bleu_examples != 0:
        objective.bleu_examples = bleu_examples
        objective.decoding = decoding or objective.decoding
        scores = objective.bleu(model, split, device)
        result.update(
            bleu=scores["model"]["bleu"],
            copy_source_bleu=scores["copy_source"]["bleu"],
            bleu_sentences=scores["model"]["sentences"],
            decoding=objective.decoding.as_dict(),
        )
    model.train(was_training)
    return result
