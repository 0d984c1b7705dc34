"""``kattn train`` and ``kattn eval`` (:mod:`kattn.train`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..train.checkpoint import json_text
from ..train.config import TASKS, RunConfig
from ..train.distributed import check_device, processes_from_env
from ..train.field_checks import refuse_text_fields
from ..train.finetune import adopt_hf, adopt_start
from ..train.loop import Interrupted, train
from ..train.objectives import objective_class
from ..train.presets import PRESETS
from ..train.run import TrainOptions, evaluate_saved_run, resolve_config
from ..train.validation import validate

#: flags that set the config (refused with --resume, which keeps the run's config.json).
_CONFIG_FLAGS = (
    "config", "task", "data", "level", "attention", "attention_option", "preset", "set", "steps",
    "batch_size", "eval_every", "seed", "device", "block_size", "tokenizer", "src", "tgt",
    "max_tokens", "from_run", "from_hf", "glue",
)  # fmt: skip

#: the flags that set a field of the text tasks, by that field: (their dest, the flag).
_TEXT_FLAGS = {
    "data.glue": ("glue", "--glue"),
    "model.init_from": ("from_run", "--from"),
    "model.init_from_hf": ("from_hf", "--from-hf"),
}


def add_train_parsers(sub: Any) -> None:
    """Add ``train`` and ``eval`` to the ``kattn`` subcommands."""
    p = sub.add_parser(
        "train",
        help="train a classifier on an LRA task, a causal language model (--task lm), a "
        "masked language model (--task mlm), a translation model (--task translation) or an "
        "image model (--task image-classification or image-generation)",
        description="Train a classifier on a Long Range Arena task, a causal language model "
        "(--task lm), a masked language model (--task mlm, BERT's pre-training), an "
        "encoder-decoder translation model (--task translation), a Vision "
        "Transformer (--task image-classification), a pixel-level image generator (--task "
        "image-generation) or a text classifier (--task text-classification, or --task "
        "finetune from an mlm run), with any mechanism. Without --data, ListOps trains on a small "
        "generated set, lm on this Python's standard-library sources, translation on the "
        "message catalogues installed on this machine with their human translations and the "
        "image tasks on generated 32x32 shapes (the embedded defaults); mlm reads the same "
        "standard-library sources as lm; text-classification and finetune (--from an mlm run) "
        "classify messages of this machine's gettext catalogues by the program they come "
        "from.",
    )
    p.add_argument(
        "--task",
        choices=TASKS,
        help="the task (default listops; lm: causal language model; mlm: masked language "
        "model, Luo et al. 2021 §4.1; translation: "
        "encoder-decoder, Luo et al. 2021 §4.3; image-classification: ViT/DeiT, §4.4; "
        "image-generation: sub-pixel causal model, Appendix A.5; text-classification: a "
        "classifier of texts trained from scratch; finetune: the same started from an mlm "
        "run's encoder, --from RUN, or a Hugging Face checkpoint, --from-hf DIR)",
    )
    p.add_argument(
        "--data",
        help="the released files: the folder holding basic_*.tsv "
        "(ListOps), new_aan_pairs.*.tsv (Retrieval), aclImdb (Text), "
        "cifar-10-batches-py (Image) or pathfinder32 (Pathfinder); for lm and mlm a text file "
        "or a folder of .txt files (split 90/5/5 at line boundaries) or a WikiText folder "
        "(wiki.{train,valid,test}.tokens or .raw); for translation an IWSLT'14 folder as "
        "fairseq prepares it (train.de, train.en, valid.*, test.*) or PREFIX of two aligned "
        "files PREFIX.<src> and PREFIX.<tgt>; for the image tasks cifar-10-batches-py, "
        "cifar-100-python, an ImageNet-style folder (train/<class>/..., val/<class>/...) or "
        "the downsampled ImageNet files (train_data_batch_*, val_data; .npz or pickles); for "
        "text-classification and finetune a folder in AG News's layout (train.csv, test.csv; "
        "without --data: gettext messages labelled by program) or, with --glue, the GLUE "
        "task's folder (or the folder holding it)",
    )
    p.add_argument(
        "--from",
        dest="from_run",
        metavar="RUN",
        help="finetune: the folder of a kattn train --task mlm run whose encoder (best.pt, "
        "else last.pt) starts the model; the encoder's shape, mechanism, tokenizer and "
        "sequence length are that run's",
    )
    p.add_argument(
        "--from-hf",
        dest="from_hf",
        metavar="DIR",
        help="finetune: a local Hugging Face checkpoint (save_pretrained's folder, with its "
        "tokenizer) loaded as a sequence classifier running --attention in every layer; its "
        "config decides the model, its tokenizer encodes the texts",
    )
    p.add_argument(
        "--glue",
        metavar="TASK",
        help="text-classification, finetune: the GLUE task of --data (CoLA, SST-2, MRPC, "
        "STS-B, QQP, MNLI, QNLI, RTE or WNLI); its dev set is reported",
    )
    p.add_argument("--src", help="translation: the source language (default de)")
    p.add_argument("--tgt", help="translation: the target language (default en)")
    p.add_argument(
        "--max-tokens",
        type=int,
        help="translation: padded tokens per batch (default 4096); --batch-size counts batches",
    )
    p.add_argument("--block-size", type=int, help="lm: tokens per training block (default 256)")
    p.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="lm, mlm: a HuggingFace tokenizer.json or a sentencepiece .model (default UTF-8 "
        "bytes); "
        "translation: a tokenizers JSON whose first ids are <pad> <bos> <eos> <unk> (default: "
        "a joint BPE learnt on the training pairs)",
    )
    p.add_argument("--level", help="Pathfinder level (default curv_contour_length_14)")
    p.add_argument("--out", help="the run folder (default runs/<task>-<attention>)")
    p.add_argument("--attention", help="mechanism name (kattn list; default softmax)")
    p.add_argument(
        "--attention-option",
        action="append",
        metavar="KEY=VALUE",
        help="a mechanism option, e.g. num_features=128 (repeatable)",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="the papers' settings: skyformer (default with --data), lra, kl, "
        "small (default without --data); for lm: luo-lm (default with --data: the "
        "WikiText-103 decoder of Luo et al. 2021) or small; for mlm: luo-bert-base (default "
        "with --data: BERT-base with NPRF and RPE, Luo et al. 2021 Appendix A.1), kl-glue "
        "(the KL-Transformer's pre-training, Table 6) or small; for translation: luo-mt "
        "(default with --data: the IWSLT'14 model of Luo et al. 2021 §4.3) or small; for "
        "image-classification: luo-deit (default with --data: DeiT-base with NPRF and 2-D "
        "RPE, §4.4) or small; for image-generation: luo-imagenet32 (default with --data, "
        "Appendix A.5) or small; for text-classification: small; for finetune: small "
        "(default), luo-bert-base (Luo et al. 2021, Table 5) or kl-glue (Table 6)",
    )
    p.add_argument(
        "--config",
        metavar="JSON",
        help="start from a saved config (a run's config.json) instead of a preset",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. model.num_layers=4 (repeatable)",
    )
    p.add_argument("--steps", type=int, help="total optimiser steps")
    p.add_argument("--batch-size", type=int, help="examples per optimiser step (all processes)")
    p.add_argument("--eval-every", type=int, help="steps between validations and checkpoints")
    p.add_argument("--seed", type=int, help="seed of the model, data order and dropout")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:N or mps")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    p.add_argument(
        "--stop-after",
        type=int,
        metavar="STEP",
        help="stop (checkpointed, resumable) once STEP steps are done",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a trained run again")
    p.add_argument("--run", required=True, help="the run folder")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--checkpoint", default="best", choices=("best", "last"))
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N or mps")
    p.set_defaults(func=cmd_eval)


def train_options(args: argparse.Namespace) -> TrainOptions:
    """The settings of ``kattn train``'s flags."""
    return TrainOptions(
        config=args.config,
        task=args.task,
        preset=args.preset,
        data=args.data,
        block_size=args.block_size,
        tokenizer=args.tokenizer,
        src=args.src,
        tgt=args.tgt,
        max_tokens=args.max_tokens,
        level=args.level,
        attention=args.attention,
        attention_options=tuple(args.attention_option or ()),
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=args.eval_every,
        seed=args.seed,
        device=args.device,
        overrides=tuple(args.set or ()),
    )


def _config(args: argparse.Namespace) -> RunConfig:
    """The resolved config of the flags; notes the preset's options the mechanism drops."""
    config, dropped = resolve_config(train_options(args))
    if args.glue:
        config.data.glue = args.glue
    if args.from_run:
        config.model.init_from = str(Path(args.from_run))
    if args.from_hf:
        config.model.init_from_hf = str(Path(args.from_hf))
    _refuse_text_fields(config, args)
    if args.from_hf:  # first: it refuses --from beside it before reading either folder
        adopt_hf(config, _given_keys(args))
    elif args.from_run:
        adopt_start(config, _given_keys(args))
    if dropped and processes_from_env().is_main:
        print(
            f"kattn: note: {config.attention.name} does not take the attention option(s) "
            f"{', '.join(dropped)} of the preset (or --config); left out",
            file=sys.stderr,
        )
    return config


def _refuse_text_fields(config: RunConfig, args: argparse.Namespace) -> None:
    """:func:`~kattn.train.field_checks.refuse_text_fields` before the starts are read, its
    refusal naming the flag that set the field (``--from is for task finetune, not mlm``)."""
    flags = {key: flag for key, (dest, flag) in _TEXT_FLAGS.items() if getattr(args, dest)}
    refuse_text_fields(config, flags)


def _given_keys(args: argparse.Namespace) -> set[str]:
    """The config keys the flags set (``attention.options.KEY`` for one option)."""
    given = {item.partition("=")[0] for item in args.set or ()}
    given |= {f"attention.options.{item.partition('=')[0]}" for item in args.attention_option or ()}
    given |= {"attention.name"} if args.attention else set()
    return given | ({"data.tokenizer"} if args.tokenizer else set())


def cmd_train(args: argparse.Namespace) -> int:
    if args.device:
        check_device(args.device, "--device")
    if args.stop_after is not None and args.stop_after < 1:
        raise ValueError(f"--stop-after must be a positive step, got {args.stop_after}")
    main = processes_from_env().is_main  # under torchrun, the first process speaks
    if args.resume:
        given = [f"--{f.replace('_', '-')}" for f in _CONFIG_FLAGS if getattr(args, f)]
        if not args.out or given:
            raise ValueError(
                "--resume takes --out RUN_DIR and keeps that run's config.json; drop "
                + (", ".join(given) or "nothing")
            )
        config = RunConfig()
    else:
        config = validate(_config(args))
    if args.print_config:
        print(config.to_json())
        return 0
    out = args.out or f"runs/{config.data.task}-{config.attention.name}"
    try:
        results = train(
            config, out, resume=args.resume, progress=not args.no_progress,
            stop_after=args.stop_after,
        )  # fmt: skip
    except Interrupted as stop:
        if main:
            print(f"kattn: {stop}", file=sys.stderr)
        return 0 if stop.signum is None else 130  # --stop-after is a finished command
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    if main:
        keys = objective_class(results["task"]).summary_keys
        print(json_text({k: results[k] for k in keys}, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    check_device(args.device, "--device")
    result = evaluate_saved_run(Path(args.run), args.split, checkpoint=args.checkpoint,
                                device=args.device)  # fmt: skip
    print(json_text(result, indent=2))
    return 0
