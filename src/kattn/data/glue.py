"""The GLUE benchmark (Wang et al. 2019) from its released TSV files.

Every task folder holds ``train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and
``dev_mismatched.tsv``) read with tabs as separators and no quote character (quotes are text).
The test files carry no labels, so the dev sets are what is reported (as Luo et al. 2021,
App. A.1, report the median over seeds on the development sets). The columns read:

=======  =========  ==========================  ==============  ===============================
task     header     text (pair)                 label           labels
=======  =========  ==========================  ==============  ===============================
CoLA     none       4th field                   2nd field       0, 1 (acceptable)
SST-2    yes        sentence                    label           0, 1 (positive)
MRPC     yes        #1 String (#2 String)       Quality         0, 1 (paraphrase)
STS-B    yes        sentence1 (sentence2)       score           a real number in [0, 5]
QQP      yes        question1 (question2)       is_duplicate    0, 1 (duplicate)
MNLI     yes        sentence1 (sentence2)       gold_label      contradiction, entailment,
                                                                neutral
QNLI     yes        question (sentence)         label           entailment, not_entailment
RTE      yes        sentence1 (sentence2)       label           entailment, not_entailment
WNLI     yes        sentence1 (sentence2)       label           0, 1
=======  =========  ==========================  ==============  ===============================

CoLA's rows are ``source, label, original judgement, sentence``. A row whose number of fields
differs from the header's, or whose label is not one of the task's, is a
:class:`~kattn.data.base.DataFormatError` naming the file and line.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from .base import DataFormatError
from .text_examples import TextExamples


@dataclass(frozen=True)
class GlueTask:
    """How one GLUE task's files are laid out and scored.

    Attributes:
        name: the task's name as GLUE writes it (its folder's name).
        text, pair, label: the columns read (names in the header, or 0-based positions when
            the files have no header); ``pair`` None for single-sentence tasks.
        labels: the label strings in class-id order; None for regression (STS-B).
        metrics: the official metrics (:mod:`kattn.train.glue_metrics`), the first one the
            task's headline number.
        dev: the dev files, by the name of the set they hold.
        header: whether the files start with a header row.
    """

    name: str
    text: str | int
    pair: str | int | None
    label: str | int
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    dev: tuple[tuple[str, str], ...] = (("dev", "dev.tsv"),)
    header: bool = True

    @property
    def regression(self) -> bool:
        return self.labels is None


_BINARY, _NLI = ("0", "1"), ("entailment", "not_entailment")
_PAIR = ("sentence1", "sentence2", "label")

#: the nine GLUE tasks by their lower-case names without punctuation.
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("CoLA", 3, None, 1, _BINARY, ("matthews", "accuracy"), header=False),
    "sst2": GlueTask("SST-2", "sentence", None, "label", _BINARY, ("accuracy",)),
    "mrpc": GlueTask("MRPC", "#1 String", "#2 String", "Quality", _BINARY, ("f1", "accuracy")),
    "stsb": GlueTask("STS-B", "sentence1", "sentence2", "score", None, ("pearson", "spearman")),
    "qqp": GlueTask("QQP", "question1", "question2", "is_duplicate", _BINARY, ("f1", "accuracy")),
    "mnli": GlueTask(
        "MNLI",
        *_PAIR[:2],
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        ("accuracy",),
        dev=(("matched", "dev_matched.tsv"), ("mismatched", "dev_mismatched.tsv")),
    ),
    "qnli": GlueTask("QNLI", "question", "sentence", "label", _NLI, ("accuracy",)),
    "rte": GlueTask("RTE", *_PAIR, _NLI, ("accuracy",)),
    "wnli": GlueTask("WNLI", *_PAIR, _BINARY, ("accuracy",)),
}

#: the range of STS-B's similarity scores.
STSB_RANGE = (0.0, 5.0)


@dataclass
class GlueData:
    """A GLUE task's labelled splits.

    Attributes:
        task: the task's layout and metrics.
        folder: the task folder read.
        train: the training examples.
        dev: the dev sets by name (``dev``; MNLI ``matched`` and ``mismatched``).
    """

    task: GlueTask
    folder: Path
    train: TextExamples
    dev: dict[str, TextExamples]


def glue_task(name: str) -> GlueTask:
    """The GLUE task called ``name`` (any case, with or without a hyphen: ``SST-2``, ``sst2``).

    Raises:
        ValueError: ``name`` is not one of the nine tasks.
    """
    key = name.lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        names = ", ".join(t.name for t in GLUE_TASKS.values())
        raise ValueError(f"glue task must be one of {names}, got {name!r}")
    return GLUE_TASKS[key]


def load_glue(path: str | PathLike[str], task: str) -> GlueData:
    """Read GLUE task ``task`` from ``path``: its folder (``.../CoLA``) or the folder holding
    the task folders (``glue_data``).

    Raises:
        DataFormatError: a file is missing or a row is damaged (the message names the file and
            line).
        ValueError: ``task`` is not a GLUE task.
    """
    spec = glue_task(task)
    folder = _task_folder(Path(path), spec)
    train = read_glue_tsv(folder / "train.tsv", spec)
    dev = {name: read_glue_tsv(folder / file, spec) for name, file in spec.dev}
    return GlueData(spec, folder, train, dev)


def _task_folder(path: Path, spec: GlueTask) -> Path:
    for folder in (path, path / spec.name):
        if (folder / "train.tsv").is_file():
            return folder
    raise DataFormatError(
        f"no GLUE {spec.name} files found: looked for train.tsv in {path} and "
        f"{path / spec.name}; expected the task folder of the GLUE release ({spec.name}/"
        f"train.tsv, {', '.join(file for _, file in spec.dev)})"
    )


def read_glue_tsv(file: Path, spec: GlueTask) -> TextExamples:
    """The labelled examples of one GLUE TSV file laid out as ``spec`` says."""
    if not file.is_file():
        raise DataFormatError(f"{file} is missing: expected a GLUE {spec.name} TSV file there")
    texts, pairs, labels = [], [], []
    with file.open(encoding="utf-8-sig", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        columns = _columns(file, spec, next(rows, None)) if spec.header else None
        width = len(columns) if columns else 4
        text, pair, label = (_position(c, columns) for c in (spec.text, spec.pair, spec.label))
        try:
            for row in rows:
                if len(row) != width:
                    raise DataFormatError(
                        f"{file}, line {rows.line_num}: {len(row)} tab-separated fields, "
                        f"expected {width} ({spec.name} layout)"
                    )
                texts.append(row[text])  # type: ignore[index]
                if pair is not None:
                    pairs.append(row[pair])
                labels.append(_label(row[label], spec, file, rows.line_num))  # type: ignore[index]
        except (csv.Error, UnicodeDecodeError) as err:
            raise DataFormatError(f"{file}, line {rows.line_num}: {err}") from None
    if not texts:
        raise DataFormatError(f"{file} holds no examples")
    return TextExamples(texts, labels, pairs if spec.pair is not None else None, str(file))


def _columns(file: Path, spec: GlueTask, header: list[str] | None) -> list[str]:
    wanted = [c for c in (spec.text, spec.pair, spec.label) if isinstance(c, str)]
    if header is None or any(c not in header for c in wanted):
        raise DataFormatError(
            f"{file}, line 1: the header must name the columns {', '.join(wanted)} "
            f"({spec.name} layout), got {header!r}"
        )
    return header


def _position(column: str | int | None, header: list[str] | None) -> int | None:
    if column is None or isinstance(column, int):
        return column
    assert header is not None
    return header.index(column)


def _label(value: str, spec: GlueTask, file: Path, line: int) -> int | float:
    if spec.labels is None:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        low, high = STSB_RANGE
        if not low <= score <= high:
            raise DataFormatError(
                f"{file}, line {line}: score {value!r} is not a number in [{low:g}, {high:g}]"
            )
        return score
    if value not in spec.labels:
        raise DataFormatError(
            f"{file}, line {line}: label {value!r} is not one of {', '.join(spec.labels)}"
        )
    return spec.labels.index(value)
