"""The translation studies of Luo et al. 2021, §4.5: many ``kattn train`` runs over seeds, each
scored on the validation split, summarised with 95% confidence intervals.

* ``conversion`` (Figure 2): Transformers with standard or normalised softmax attention, with
  or without a relative positional encoding (every attention of the encoder–decoder with the
  variant's mechanism; the cross-attention without the encoding), each scored as trained
  ("Oracle") and after its softmax is replaced by PRF kernelized attention with M random
  features, without fine-tuning (:func:`kattn.train.conversion.convert_run`).
* ``feature-dim`` (Figure 3a): NPRF attention with RPE (``nprf_rpe``) trained from scratch with
  M features (the decoder and cross-attention too, unless ``decoder_features`` is given).
* ``feature-map`` (Figure 3b): ``nprf_rpe`` with the feature maps PRF (iid Gaussian ``w_i``),
  TRF (Luo et al. eq. 4), Sphere-PRF (``w_i`` iid uniform on √d·S^{d−1}) and ORF (orthogonal
  ``w_i``), with M features in the encoder and ``decoder_features`` in the decoder (§4.3:
  16 and 24).

Every model is an ordinary run folder under the study's folder (``kattn translate`` and
``kattn eval`` read it); a run whose ``results.json`` exists is not trained again and one with
only ``last.pt`` is resumed, so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .bleu import Decoding
from .checkpoint import LAST, save_json
from .config import AttentionConfig, RunConfig, load_config
from .conversion import convert_run, evaluate_translation, load_run_data
from .loop import CONFIG, RESULTS, train
from .overrides import apply_overrides, preset
from .study_report import markdown, plot, summarise
from .trained import load_trained_model
from .translation import decoding_of
from .validation import validate

STUDIES = ("conversion", "feature-dim", "feature-map")
#: conversion variants: key → (label, mechanism, options) (Luo et al. 2021, §4.5).
VARIANTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "softmax": ("standard", "softmax", {}),
    "softmax_rpe": ("standard + RPE", "softmax_rpe", {"rpe": "toeplitz"}),
    "normalized_softmax": ("normalized", "normalized_softmax", {}),
    "normalized_softmax_rpe": ("normalized + RPE", "normalized_softmax", {"rpe": "toeplitz"}),
}
#: feature maps of Figure 3b: key → (label, options of ``nprf_rpe``).
FEATURE_MAPS: dict[str, tuple[str, dict[str, Any]]] = {
    "prf": ("PRF", {"feature_map": "prf", "sampling": "gaussian"}),
    "trf": ("TRF", {"feature_map": "trf", "sampling": "gaussian"}),
    "sphere-prf": ("Sphere-PRF", {"feature_map": "prf", "sampling": "sphere"}),
    "orf": ("ORF", {"feature_map": "prf", "sampling": "orthogonal"}),
}
_TEXT = {
    "conversion": (
        "softmax attention converted to PRF kernelized attention without fine-tuning",
        "Luo et al. 2021, §4.5, Figure 2",
        "Each variant is trained, scored as trained (Oracle), then its softmax attentions are "
        "replaced by PRF kernelized attention with M random features, keeping every weight.",
        "trained attention",
    ),
    "feature-dim": (
        "NPRF attention with RPE trained with M random features",
        "Luo et al. 2021, §4.5, Figure 3a",
        "nprf_rpe trained from scratch with M features in every attention (unless the decoder's "
        "are given).",
        "features",
    ),
    "feature-map": (
        "NPRF attention with RPE and different feature maps",
        "Luo et al. 2021, §4.5, Figure 3b",
        "nprf_rpe trained from scratch with each feature map (PRF: iid Gaussian w; TRF: "
        "sin/cos features; Sphere-PRF: w uniform on the sphere of radius √d; ORF: orthogonal w).",
        "feature map",
    ),
}
#: attention fields a study sets itself (``--set`` may not change them).
_OWN_KEYS = ("attention.name=", "attention.decoder=", "attention.cross=")


@dataclass(frozen=True)
class StudySettings:
    """A study's settings (``kattn study``'s flags); None: the preset's."""

    out: Path
    data: str | None = None
    preset: str = "small"
    overrides: tuple[str, ...] = ()
    steps: int | None = None
    seeds: int = 5
    bleu_examples: int = 400
    beam: int = 1
    features: tuple[int, ...] = (16, 32, 64, 128)
    decoder_features: int | None = None
    variants: tuple[str, ...] = tuple(VARIANTS)
    feature_maps: tuple[str, ...] = tuple(FEATURE_MAPS)
    sampling: str = "gaussian"
    device: str | None = None
    progress: bool = True

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["out"] = str(self.out)
        return values


@dataclass(frozen=True)
class Row:
    """A trained variant: its key (run folder prefix), label and attention config."""

    key: str
    label: str
    attention: AttentionConfig = field(repr=False)


def study_rows(study: str, settings: StudySettings) -> list[Row]:
    """The variants that ``study`` trains (each for ``settings.seeds`` seeds)."""
    if study not in STUDIES:
        raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    if study == "conversion":
        unknown = [v for v in settings.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}; variants: {', '.join(VARIANTS)}")
        return [
            Row(key, VARIANTS[key][0], AttentionConfig(VARIANTS[key][1], dict(VARIANTS[key][2])))
            for key in settings.variants
        ]
    if study == "feature-dim":
        return [
            Row(f"nprf_rpe-m{m}", f"M={m}", _nprf({"num_features": m}, settings))
            for m in settings.features
        ]
    unknown = [f for f in settings.feature_maps if f not in FEATURE_MAPS]
    if unknown:
        raise ValueError(f"unknown feature maps {unknown}; feature maps: {', '.join(FEATURE_MAPS)}")
    if len(settings.features) != 1:
        raise ValueError(f"study feature-map takes one M (--features), got {settings.features}")
    m = settings.features[0]
    return [
        Row(
            f"nprf_rpe-{key}",
            FEATURE_MAPS[key][0],
            _nprf({**FEATURE_MAPS[key][1], "num_features": m}, settings),
        )
        for key in settings.feature_maps
    ]


def _nprf(options: dict[str, Any], settings: StudySettings) -> AttentionConfig:
    attention = AttentionConfig("nprf_rpe", dict(options))
    if settings.decoder_features is not None:
        attention.decoder_options["num_features"] = settings.decoder_features
        attention.cross_options["num_features"] = settings.decoder_features
    return attention


def study_config(settings: StudySettings, attention: AttentionConfig, seed_index: int) -> RunConfig:
    """The run config of one variant and seed: the preset, the data, the variant's attention,
    the ``--set`` overrides, then steps, seed (the preset's + ``seed_index``) and BLEU
    settings."""
    bad = [o for o in settings.overrides if o.startswith(_OWN_KEYS)]
    if bad:
        raise ValueError(f"the study chooses the mechanisms: drop --set {', '.join(bad)}")
    config = preset(settings.preset, "translation")
    config.attention = copy.deepcopy(attention)
    if settings.data:
        config.data.path = str(Path(settings.data))
    apply_overrides(config, list(settings.overrides))
    if settings.steps is not None:
        config.train.steps = settings.steps
    config.train.seed += seed_index
    config.train.beam_size = settings.beam
    config.train.bleu_examples = settings.bleu_examples
    if settings.device:
        config.train.device = settings.device
    return validate(config)


def ensure_trained(config: RunConfig, run: Path, progress: bool) -> str:
    """Train ``config`` in ``run`` unless it is done (``results.json``); resume it when only
    ``last.pt`` is there. Returns ``trained``, ``resumed`` or ``done``.

    Raises:
        ValueError: ``run`` holds a run of another config.
    """
    if (run / CONFIG).is_file():
        saved = load_config(run / CONFIG).to_dict()
        wanted = config.to_dict()
        saved["train"]["device"] = wanted["train"]["device"]
        if saved != wanted and ((run / RESULTS).exists() or (run / LAST).exists()):
            raise ValueError(
                f"{run} holds a run of another config (change --out, or remove the folder to "
                f"train it again)"
            )
    if (run / RESULTS).is_file():
        return "done"
    resume = (run / LAST).is_file()
    train(config, run, resume=resume, progress=progress)
    return "resumed" if resume else "trained"


#: the file of a study's scores in each run folder.
SCORES = "study-scores.json"


def run_study(
    study: str, settings: StudySettings, note: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train (or reuse) every run of ``study``, score them, and write ``study.json``,
    ``study.md`` and ``study.png`` (skipped with a warning without matplotlib) in
    ``settings.out``; returns ``study.json``'s contents. ``note`` gets the progress lines
    (default: standard error)."""
    say = note or (lambda line: print(f"[study {study}] {line}", file=sys.stderr, flush=True))
    rows = study_rows(study, settings)
    if study == "conversion":
        columns = [{"key": "oracle", "label": "Oracle"}] + [
            {"key": f"m{m}", "label": f"M={m}"} for m in settings.features
        ]
    else:
        columns = [{"key": "trained", "label": "trained"}]
    records, runs = [], []
    total = len(rows) * settings.seeds
    for r, row in enumerate(rows):
        for i in range(settings.seeds):
            config = study_config(settings, row.attention, i)
            seed = config.train.seed
            run = settings.out / f"{row.key}-seed{seed}"
            say(f"run {r * settings.seeds + i + 1}/{total}: {row.label}, seed {seed} ({run})")
            status = ensure_trained(config, run, settings.progress)
            say(f"{run.name}: {status}")
            runs.append({"name": run.name, "row": row.key, "seed": seed, "status": status,
                         "attention": asdict(row.attention)})  # fmt: skip
            base = {"run": run.name, "row": row.key, "seed": seed}
            decoding = decoding_of(config)  # the run's decoding, with the study's beam
            records += _score(study, run, settings, decoding, columns, base, say)
    study_json = {
        "study": study,
        "title": _TEXT[study][0],
        "reference": _TEXT[study][1],
        "description": _TEXT[study][2],
        "row_heading": _TEXT[study][3],
        "settings": settings.as_dict(),
        "rows": [{"key": row.key, "label": row.label} for row in rows],
        "columns": columns,
        "runs": runs,
        "records": records,
        "summary": summarise(records),
    }
    out = settings.out
    save_json(out / "study.json", study_json)
    (out / "study.md").write_text(markdown(study_json), encoding="utf-8")
    figure = plot(study_json, out / "study.png")
    say(f"wrote {out / 'study.json'}, {out / 'study.md'}" + (f", {figure}" if figure else ""))
    return study_json


def _score(
    study: str,
    run: Path,
    settings: StudySettings,
    decoding: Decoding,
    columns: list[dict[str, str]],
    base: dict[str, Any],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The run's records: the trained model, and for ``conversion`` each conversion; kept in
    the run folder (:data:`SCORES`) with what they depend on, and reused when a study with the
    same scoring settings runs again (an interrupted or extended study does not score twice)."""
    key = {
        "study": study, "columns": [c["key"] for c in columns], "sampling": settings.sampling,
        "bleu_examples": settings.bleu_examples, "decoding": decoding.as_dict(),
        "best_pt_mtime_ns": (run / "best.pt").stat().st_mtime_ns,
    }  # fmt: skip
    cached = _cached_scores(run, key)
    if cached is not None:
        say(f"{run.name}: scores reused ({run / SCORES})")
        return [{**base, **record} for record in cached]
    records = _score_now(study, run, settings, decoding, columns, base, say)
    kept = [{k: v for k, v in r.items() if k not in base} for r in records]
    save_json(run / SCORES, {"key": key, "records": kept})
    return records


def _cached_scores(run: Path, key: dict[str, Any]) -> list[dict[str, Any]] | None:
    path = run / SCORES
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved["records"] if saved.get("key") == key else None


def _score_now(
    study: str,
    run: Path,
    settings: StudySettings,
    decoding: Decoding,
    columns: list[dict[str, str]],
    base: dict[str, Any],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    config, data = load_run_data(run)
    device = config.train.device
    model, _, _ = load_trained_model(run, "best", device)

    def record(column: str, model: Any, extra: dict[str, Any]) -> dict[str, Any]:
        metrics = evaluate_translation(
            model, config, data, "valid", bleu_examples=settings.bleu_examples, decoding=decoding
        )
        say(f"{run.name} {column}: valid loss {metrics['loss']:.4f}, BLEU {metrics['bleu']:.2f}")
        return {**base, "column": column, **extra, **metrics}

    first = columns[0]["key"]
    records = [record(first, model, {})]
    for m in settings.features if study == "conversion" else ():
        options = {"num_features": m, "sampling": settings.sampling}
        converted, conversion = convert_run(run, None, options, seed=base["seed"], device=device)
        targets = {k: name for k, (name, _) in conversion.converted.items()}
        records.append(record(f"m{m}", converted, {"num_features": m, "targets": targets}))
    return records
