"""AG News (Zhang, Zhao & LeCun 2015) in its released CSV layout, and a writer of that layout.

A folder holds ``train.csv`` and ``test.csv`` (and optionally ``classes.txt``, one class name
per line). Each row is three double-quoted fields, ``"class","title","description"``, with no
header; the class is 1-based (AG News: 1 World, 2 Sports, 3 Business, 4 Sci/Tech); an inner
double quote is written twice. The release's readme says line breaks are escaped as ``\\n``; its
files hold a lone backslash where a line broke (``dwindling\\band of``), so every backslash is
read as a line break. The text of an example is the title and the description joined by a
space (either may be empty). The embedded text-classification set
(:mod:`kattn.data.text_classification_embedded`) is written in this layout by
:func:`write_agnews_csv` and read back by :func:`load_agnews`.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from .base import DataFormatError
from .text_examples import TextExamples

#: AG News's classes, in class-id order.
AGNEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")
AGNEWS_FILES = ("train.csv", "test.csv")


@dataclass
class ClassificationTexts:
    """A text-classification set of the AG News layout.

    Attributes:
        folder: the folder read.
        train, test: the labelled examples (class ids 0 … C−1).
        classes: the class names (from ``classes.txt``; AG News's when the folder has none
            and four classes are used; else ``"1"``, ``"2"`` …).
    """

    folder: Path
    train: TextExamples
    test: TextExamples
    classes: tuple[str, ...]


def load_agnews(path: str | PathLike[str]) -> ClassificationTexts:
    """Read ``train.csv`` and ``test.csv`` (and ``classes.txt`` if present) from ``path``.

    Raises:
        DataFormatError: a file is missing, a row has not three fields, or its class is not
            an integer from 1 to the number of classes (the message names file and line).
    """
    folder = Path(path)
    names = _class_names(folder / "classes.txt")
    splits = {}
    for file in AGNEWS_FILES:
        splits[file] = read_agnews_csv(folder / file, None if names is None else len(names))
    count = max(max(s.labels) for s in splits.values()) + 1
    if names is None:
        names = AGNEWS_CLASSES if count == 4 else tuple(str(i + 1) for i in range(int(count)))
    return ClassificationTexts(folder, splits["train.csv"], splits["test.csv"], names)


def read_agnews_csv(file: Path, num_classes: int | None = None) -> TextExamples:
    """The examples of one AG News CSV file (class ids 0-based); classes above
    ``num_classes`` are refused when it is given."""
    if not file.is_file():
        raise DataFormatError(
            f"{file} is missing: expected AG News's CSV layout there (train.csv, test.csv of "
            f'"class","title","description" rows)'
        )
    texts, labels = [], []
    with file.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle)
        try:
            for row in rows:
                if len(row) != 3:
                    raise DataFormatError(
                        f'{file}, line {rows.line_num}: {len(row)} fields, expected 3 ("class",'
                        f'"title","description")'
                    )
                labels.append(_class_id(row[0], num_classes, file, rows.line_num))
                title, description = (field.replace("\\", "\n") for field in row[1:])
                texts.append(" ".join(part for part in (title, description) if part))
        except (csv.Error, UnicodeDecodeError) as err:
            raise DataFormatError(f"{file}, line {rows.line_num}: {err}") from None
    if not texts:
        raise DataFormatError(f"{file} holds no examples")
    return TextExamples(texts, labels, source=str(file))


def write_agnews_csv(file: Path, texts: Sequence[str], labels: Sequence[int]) -> None:
    """Write ``texts`` with 0-based ``labels`` as AG News rows (empty title, the text as the
    description, line breaks as backslashes).

    Raises:
        ValueError: a text holds a backslash, which the layout cannot represent.
    """
    with file.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for text, label in zip(texts, labels, strict=True):
            if "\\" in text:
                raise ValueError(
                    f"texts must not hold a backslash (AG News's line break): {text!r}"
                )
            writer.writerow([label + 1, "", text.replace("\n", "\\")])


def _class_id(value: str, num_classes: int | None, file: Path, line: int) -> int:
    try:
        label = int(value)
    except ValueError:
        label = 0
    if label < 1 or (num_classes is not None and label > num_classes):
        wanted = "a positive integer" if num_classes is None else f"an integer 1 to {num_classes}"
        raise DataFormatError(f"{file}, line {line}: class {value!r} is not {wanted}")
    return label - 1


def _class_names(file: Path) -> tuple[str, ...] | None:
    if not file.is_file():
        return None
    names = tuple(line.strip() for line in file.read_text(encoding="utf-8").splitlines())
    names = tuple(name for name in names if name)
    if not names:
        raise DataFormatError(f"{file} names no classes (one class name per line expected)")
    return names
