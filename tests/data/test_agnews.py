"""AG News's CSV layout on files written here (quoted fields, doubled quotes, backslash line
breaks, 1-based classes, optional classes.txt), the writer's round trip, and damaged files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kattn.data import DataFormatError
from kattn.data.agnews import AGNEWS_CLASSES, load_agnews, read_agnews_csv, write_agnews_csv

TRAIN = (
    '"3","Wall St. Bears Claw Back Into the Black (Reuters)","Reuters - Short-sellers, Wall '
    "Street's dwindling\\band of ultra-cynics, are seeing green again.\"\n"
    '"2","Phelps Wins ""Gold""","ATHENS - He won."\n'
    '"4","","Only a description"\n'
    '"1","A title only",""\n'
)
TEST = '"1","Talks","Leaders meet."\n"4","Chips","Faster chips."\n'


def write(folder: Path, train: str = TRAIN, test: str = TEST) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "train.csv").write_text(train, encoding="utf-8")
    (folder / "test.csv").write_text(test, encoding="utf-8")
    return folder


def test_reads_the_release_layout(tmp_path: Path) -> None:
    data = load_agnews(write(tmp_path))
    assert data.classes == AGNEWS_CLASSES
    assert data.train.labels == [2, 1, 3, 0] and data.test.labels == [0, 3]
    assert data.train.texts[0] == (
        "Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall "
        "Street's dwindling\nband of ultra-cynics, are seeing green again."
    )
    assert data.train.texts[1] == 'Phelps Wins "Gold" ATHENS - He won.'
    assert data.train.texts[2:] == ["Only a description", "A title only"]
    assert data.train.pairs is None


def test_classes_file_names_and_bounds_the_classes(tmp_path: Path) -> None:
    write(tmp_path)
    (tmp_path / "classes.txt").write_text("a\nb\nc\nd\ne\n", encoding="utf-8")
    assert load_agnews(tmp_path).classes == ("a", "b", "c", "d", "e")
    (tmp_path / "classes.txt").write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"train.csv, line 3: class '4' is not an integer"):
        load_agnews(tmp_path)


@pytest.mark.parametrize(
    ("train", "match"),
    [
        ('"1","only two"\n', r"train.csv, line 1: 2 fields, expected 3"),
        ('"1","a","b"\n"x","a","b"\n', r"train.csv, line 2: class 'x' is not"),
        ('"0","a","b"\n', r"line 1: class '0' is not"),
        ("", r"train.csv holds no examples"),
    ],
)
def test_damaged_files_name_file_and_line(tmp_path: Path, train: str, match: str) -> None:
    with pytest.raises(DataFormatError, match=match):
        load_agnews(write(tmp_path, train=train))


def test_missing_file(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text('"1","a","b"\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"test\.csv is missing"):
        load_agnews(tmp_path)


def test_writer_round_trips(tmp_path: Path) -> None:
    texts = ['say "hi", then\ngo', "plain, with a comma", "ünïcödé"]
    write_agnews_csv(tmp_path / "x.csv", texts, [2, 0, 1])
    back = read_agnews_csv(tmp_path / "x.csv")
    assert back.texts == texts and back.labels == [2, 0, 1]
    with pytest.raises(ValueError, match="backslash"):
        write_agnews_csv(tmp_path / "y.csv", ["a\\b"], [0])
