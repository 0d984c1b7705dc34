"""``kattn study conversion | feature-dim | feature-map``: the translation studies of Luo et al.
2021, §4.5 (Figures 2, 3a and 3b), many training runs over seeds with the mean and 95%
confidence interval of each cell (:mod:`kattn.train.studies`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..train.distributed import check_device
from ..train.presets import PRESETS
from ..train.studies import FEATURE_MAPS, VARIANTS, StudySettings, run_study
from .types import int_at_least, int_list, name_list, output_folder

_HELP = {
    "conversion": "train standard/normalized softmax attention with/without RPE, then score "
    "each as trained (Oracle) and converted to PRF kernelized attention with M features, "
    "without fine-tuning (Luo et al. 2021, §4.5, Figure 2)",
    "feature-dim": "train nprf_rpe with M random features for each M (Luo et al. 2021, §4.5, "
    "Figure 3a)",
    "feature-map": "train nprf_rpe with the feature maps PRF, TRF, Sphere-PRF and ORF (Luo et "
    "al. 2021, §4.5, Figure 3b)",
}

#: each study's feature map dimensions M: the default and what they are.
_FEATURES = {
    "conversion": ((16, 32, 64, 128), "feature map dimensions M of the conversions"),
    "feature-dim": ((16, 32, 64, 128), "the feature map dimensions M trained"),
    "feature-map": ((16,), "M of the encoder, as in Luo et al. §4.3"),
}


def add_study_parser(sub: Any) -> None:
    """Add ``study`` and its three studies to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "study",
        help="the translation studies of Luo et al. 2021, §4.5 (conversion without "
        "fine-tuning, feature map dimension, feature maps)",
        description="Train every variant of a study for several seeds (each an ordinary "
        "kattn train run folder under --out; finished runs are reused and interrupted ones "
        "resumed), score each on the validation split (loss, and BLEU of the first "
        "--bleu-examples pairs, greedy by default: fast on a CPU), and write study.json "
        "(every number, per seed), study.md (mean ± 95% confidence interval, Student's t) and "
        "study.png (with matplotlib).",
    )
    studies = p.add_subparsers(dest="study", required=True)
    for name, text in _HELP.items():
        q = studies.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _common(q, name)
        default, text = _FEATURES[name]
        q.add_argument(
            "--features", type=int_list(1), default=default,
            help=f"{text} (default {','.join(map(str, default))})",
        )  # fmt: skip
        if name == "conversion":
            q.add_argument(
                "--variants", type=name_list, default=",".join(VARIANTS),
                help=f"the trained variants (default all: {','.join(VARIANTS)})",
            )  # fmt: skip
            q.add_argument(
                "--sampling", default="gaussian", choices=("gaussian", "orthogonal", "sphere"),
                help="the random projection of the PRF features (default gaussian: iid w_i, "
                "Luo et al. eq. 5)",
            )  # fmt: skip
        elif name == "feature-dim":
            q.add_argument(
                "--decoder-features", type=int_at_least(1),
                help="M of the decoder's self- and cross-attention (default: the same M)",
            )  # fmt: skip
        else:
            q.add_argument(
                "--decoder-features", type=int_at_least(1), default=24,
                help="M of the decoder's self- and cross-attention (default 24, §4.3)",
            )  # fmt: skip
            q.add_argument(
                "--feature-maps", type=name_list, default=",".join(FEATURE_MAPS),
                help=f"the feature maps (default all: {','.join(FEATURE_MAPS)})",
            )  # fmt: skip
        q.set_defaults(func=cmd_study)


def _common(q: argparse.ArgumentParser, name: str) -> None:
    q.add_argument(
        "--out", type=output_folder, help=f"the study folder (default runs/study-{name})"
    )
    q.add_argument(
        "--data",
        help="an IWSLT'14 folder as fairseq prepares it, or PREFIX of two aligned files "
        "(default: the embedded gettext corpus)",
    )
    q.add_argument(
        "--preset", default="small", choices=sorted(k for k in PRESETS if "translation" in
                                                    PRESETS[k]),
        help="the run settings (default small; luo-mt: the model of Luo et al. §4.3)",
    )  # fmt: skip
    q.add_argument(
        "--set", action="append", metavar="SECTION.FIELD=VALUE",
        help="override a config field of every run, e.g. model.num_layers=1 (repeatable)",
    )  # fmt: skip
    q.add_argument("--steps", type=int_at_least(1), help="training steps (default: the preset's)")
    q.add_argument("--seeds", type=int_at_least(1), default=5, help="seeds per variant (default 5)")
    q.add_argument(
        "--bleu-examples", type=int_at_least(1), default=400,
        help="BLEU on the first N validation pairs (default 400)",
    )  # fmt: skip
    q.add_argument(
        "--beam", type=int_at_least(1), default=1,
        help="beam size of the BLEU decoding (default 1: greedy, fast on a CPU; the paper "
        "decodes with beam 5)",
    )  # fmt: skip
    q.add_argument("--device", help="auto (the preset's default), cpu, cuda, cuda:N or mps")
    q.add_argument("--no-progress", action="store_true", help="no progress bars")


def cmd_study(args: argparse.Namespace) -> int:
    if args.device:
        check_device(args.device, "--device")
    study = args.study
    settings = StudySettings(
        out=Path(args.out or f"runs/study-{study}"),
        data=args.data,
        preset=args.preset,
        overrides=tuple(args.set or ()),
        steps=args.steps,
        seeds=args.seeds,
        bleu_examples=args.bleu_examples,
        beam=args.beam,
        features=tuple(args.features),
        decoder_features=getattr(args, "decoder_features", None),
        variants=tuple(getattr(args, "variants", ",".join(VARIANTS)).split(",")),
        feature_maps=tuple(getattr(args, "feature_maps", ",".join(FEATURE_MAPS)).split(",")),
        sampling=getattr(args, "sampling", "gaussian"),
        device=args.device,
        progress=not args.no_progress,
    )
    result = run_study(study, settings)
    print((settings.out / "study.md").read_text(encoding="utf-8"), end="")
    print(f"\n{len(result['runs'])} runs in {settings.out}")
    return 0
