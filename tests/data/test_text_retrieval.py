"""Text (IMDB) and Retrieval (AAN) loaders on tiny files in the released layouts: ids of known
strings, padding, truncation counts, splits, error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kattn.data.base import DataFormatError, SequenceDataset, pad_sequences
from kattn.data.retrieval import MAX_DOC_BYTES, load_retrieval
from kattn.data.text import load_text, pad_bytes


def ids(text: str) -> list[int]:
    """The expected byte-level ids: UTF-8 byte + 1."""
    return [b + 1 for b in text.encode("utf-8")]


def row(data: SequenceDataset, i: int, second: bool = False) -> list[int]:
    """Example i's ids up to its length (checking that the rest is padding)."""
    tokens = data.tokens2 if second else data.tokens
    lengths = data.lengths2 if second else data.lengths
    assert tokens is not None and lengths is not None
    n = int(lengths[i])
    assert torch.all(tokens[i, n:] == 0)
    return tokens[i, :n].tolist()


def test_pad_bytes_matches_pad_sequences() -> None:
    docs = [b"", b"ab", "é\x00\xff".encode("latin-1"), b"x" * 9]
    tokens, lengths = pad_bytes(docs, 5)
    expected_tokens, expected_lengths = pad_sequences([[b + 1 for b in d] for d in docs], 5)
    assert torch.equal(tokens, expected_tokens)
    assert torch.equal(lengths, expected_lengths)
    assert tokens.dtype == torch.int16  # stored compactly; items come out as int64
    assert tokens[2, :3].tolist() == [0xE9 + 1, 1, 256]  # byte 0 → id 1, byte 255 → id 256


# --- Text (IMDB) ---------------------------------------------------------------------------

REVIEWS = {
    # split → label folder → {file name: text}
    "train": {
        "neg": {"10_2.txt": "Bad film.", "9_1.txt": "Awful"},
        "pos": {"3_10.txt": "  Café é!\n", "0_8.txt": "Great " * 5},
    },
    "test": {
        "neg": {"1_3.txt": "meh"},
        "pos": {"2_9.txt": "naïve charm, loved it"},
    },
}


def write_imdb(root: Path) -> Path:
    imdb = root / "aclImdb"
    for split, folders in REVIEWS.items():
        for label, files in folders.items():
            folder = imdb / split / label
            folder.mkdir(parents=True)
            for name, text in files.items():
                (folder / name).write_text(text, encoding="utf-8")
    # what the release holds besides the labelled reviews, none of it read
    (imdb / "train" / "unsup").mkdir()
    (imdb / "train" / "unsup" / "0_0.txt").write_text("unlabelled")
    (imdb / "train" / "urls_pos.txt").write_text("http://example.org\n")
    (imdb / "train" / "labeledBow.feat").write_text("0 0:1\n")
    (imdb / "imdb.vocab").write_text("the\n")
    (imdb / "train" / "pos" / "notes.md").write_text("not a review")
    return imdb


def test_text_ids_labels_order_and_padding(tmp_path: Path) -> None:
    write_imdb(tmp_path)
    task = load_text(tmp_path, max_len=64)
    assert (task.task, task.vocab_size, task.num_classes, task.max_len) == ("text", 257, 2, 64)
    train = task.train
    assert train.tokens.shape == (4, 64)
    # negatives first, each label folder in order of review id (9 before 10)
    assert train.labels.tolist() == [0, 0, 1, 1]
    assert row(train, 0) == ids("Awful")
    assert row(train, 1) == ids("Bad film.")
    assert row(train, 2) == ids(("Great " * 5).strip())
    # surrounding whitespace stripped as TFDS does; 'é' is bytes c3 a9 → ids 196, 170
    assert row(train, 3) == ids("Café é!")
    assert row(train, 3)[3:5] == [196, 170]
    assert train.lengths.tolist() == [5, 9, 29, 9]
    assert task.test.labels.tolist() == [0, 1]
    assert row(task.test, 1) == ids("naïve charm, loved it")
    # LRA validates on the test split
    assert task.valid is task.test
    assert "test" in task.info["valid"]
    assert task.info["ignored_files"] == 1  # train/pos/notes.md
    assert task.info["truncated"] == {"train": 0, "test": 0}


def test_text_truncation_counts(tmp_path: Path) -> None:
    write_imdb(tmp_path)
    task = load_text(tmp_path / "aclImdb", max_len=5)  # the aclImdb folder itself works too
    # train: "Awful" is exactly 5 bytes (not cut); the other three are longer
    assert task.info["truncated"] == {"train": 3, "test": 1}
    assert task.train.lengths.tolist() == [5, 5, 5, 5]
    assert task.train.tokens[3].tolist() == ids("Café")  # 'é' is two bytes: 'C','a','f',c3,a9
    assert task.test.lengths.tolist() == [3, 5]


def test_text_held_out_valid(tmp_path: Path) -> None:
    write_imdb(tmp_path)
    task = load_text(tmp_path, max_len=32, valid=0.5, seed=3)
    full = load_text(tmp_path, max_len=32)
    assert (len(task.train), len(task.valid), len(task.test)) == (2, 2, 2)
    assert task.valid is not task.test
    rows = {tuple(r) for r in full.train.tokens.tolist()}
    parts = [tuple(r) for r in torch.cat([task.train.tokens, task.valid.tokens]).tolist()]
    assert sorted(parts) == sorted(rows)  # a partition of train
    again = load_text(tmp_path, max_len=32, valid=0.5, seed=3)
    assert torch.equal(again.valid.tokens, task.valid.tokens)  # seeded
    assert set(task.info["truncated"]) == {"train", "valid", "test"}
    assert "seed 3" in task.info["valid"]


@pytest.mark.parametrize("valid", ["train", 0.0, 1.0, 1.5, True])
def test_text_rejects_bad_valid(tmp_path: Path, valid: object) -> None:
    write_imdb(tmp_path)
    with pytest.raises(ValueError, match="valid"):
        load_text(tmp_path, valid=valid)  # type: ignore[arg-type]


def test_text_valid_fraction_too_small_for_the_data(tmp_path: Path) -> None:
    write_imdb(tmp_path)
    with pytest.raises(ValueError, match="holds out 0"):
        load_text(tmp_path, valid=0.1)  # 0.1 of 4 reviews rounds to 0


def test_text_missing_folders(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="looked for train/ and test/") as err:
        load_text(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere" / "aclImdb") in str(err.value)
    imdb = write_imdb(tmp_path)
    for path in (imdb / "test" / "neg").iterdir():
        path.unlink()
    (imdb / "test" / "neg").rmdir()
    with pytest.raises(DataFormatError, match="neg is missing") as err:
        load_text(tmp_path)
    assert str(imdb / "test" / "neg") in str(err.value)


def test_text_empty_label_folder_and_bad_utf8(tmp_path: Path) -> None:
    imdb = write_imdb(tmp_path)
    bad = imdb / "train" / "neg" / "11_1.txt"
    bad.write_bytes(b"caf\xe9")  # latin-1, not UTF-8
    with pytest.raises(DataFormatError, match="not UTF-8") as err:
        load_text(tmp_path)
    assert str(bad) in str(err.value)
    bad.unlink()
    for path in (imdb / "test" / "pos").iterdir():
        path.unlink()
    with pytest.raises(DataFormatError, match=r"holds no <id>_<rating>\.txt reviews"):
        load_text(tmp_path)


# --- Retrieval (AAN) -----------------------------------------------------------------------

AAN_ROWS = {
    "train": [
        '1.0\tP01-1001\tP02-2002\tHe said "hello" to\tthe "quoted" one',
        "0\tA\tB\tnaïve\tplain",
        "0.0\tC\tD\t\tx",  # an empty text1
    ],
    "eval": ["1\tE\tF\tabc\tdef"],
    "test": ["0\tG\tH\tz" + "y" * 11 + "\tshort", "1.0\tI\tJ\tq\tr"],
}


def write_aan(folder: Path, rows: dict[str, list[str]] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in (rows or AAN_ROWS).items():
        path = folder / f"new_aan_pairs.{split}.tsv"
        path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return folder


def test_retrieval_pairs_labels_and_quotes(tmp_path: Path) -> None:
    write_aan(tmp_path / "lra_release" / "tsv_data")
    task = load_retrieval(tmp_path / "lra_release", max_len=16)
    assert (task.task, task.vocab_size, task.num_classes, task.max_len) == (
        "retrieval",
        257,
        2,
        16,
    )
    train = task.train
    assert train.paired
    assert train.tokens2 is not None and train.tokens2.shape == (3, 16)
    assert train.labels.tolist() == [1, 0, 0]  # "1.0", "0", "0.0"
    # quotes are text: no quote handling; '"' is byte 0x22 → id 35
    assert row(train, 0) == ids('He said "hello" ')
    assert row(train, 0)[8] == 35
    assert row(train, 0, second=True) == ids('the "quoted" one')
    assert row(train, 1) == ids("naïve")
    assert row(train, 1)[2:4] == [196, 176]  # 'ï' = c3 af
    assert row(train, 2) == [] and train.lengths[2] == 0
    assert (len(task.train), len(task.valid), len(task.test)) == (3, 1, 2)
    assert task.valid.labels.tolist() == [1]
    assert row(task.test, 0) == ids("z" + "y" * 11)
    # one text cut in train ('He said "hello" to' is 18 bytes)
    assert task.info["truncated"] == {"train": 1, "valid": 0, "test": 0}


def test_retrieval_folder_of_files_and_truncation(tmp_path: Path) -> None:
    folder = write_aan(tmp_path / "aan")
    task = load_retrieval(folder, max_len=3)
    # texts longer than 3 bytes: train 4 (text1, text2 of row 1; 'naïve', 'plain'),
    # valid 0 ('abc', 'def' are 3), test 2
    assert task.info["truncated"] == {"train": 4, "valid": 0, "test": 2}
    assert task.test.tokens.tolist() == [ids("zyy"), [*ids("q"), 0, 0]]
    assert task.test.lengths.tolist() == [3, 1]


def test_retrieval_cuts_texts_at_10000_bytes(tmp_path: Path) -> None:
    rows = {
        "train": ["1\ta\tb\t" + "é" * 6000 + "\tshort"],  # 12,000 bytes
        "eval": ["0\ta\tb\tx\ty"],
        "test": ["0\ta\tb\tx\ty"],
    }
    folder = write_aan(tmp_path, rows)
    task = load_retrieval(folder, max_len=MAX_DOC_BYTES + 100)
    assert int(task.train.lengths[0]) == MAX_DOC_BYTES
    assert task.train.tokens[0, :2].tolist() == [196, 170]
    assert task.info["truncated"]["train"] == 0  # cut by the 10,000-byte rule, not max_len
    task = load_retrieval(folder, max_len=50)
    assert task.info["truncated"]["train"] == 1


def test_retrieval_keeps_carriage_returns_inside_texts(tmp_path: Path) -> None:
    rows = {"train": ["1\ta\tb\tx\ry\tz\r"], "eval": ["0\ta\tb\tx\ty"], "test": ["0\ta\tb\tx\ty"]}
    task = load_retrieval(write_aan(tmp_path, rows), max_len=8)
    assert row(task.train, 0) == ids("x\ry")  # a "\r" inside a text is a byte
    assert row(task.train, 0, second=True) == ids("z")  # "\r\n" ends the line


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("1\tA\tB\tonly four", "4 tab-separated columns, expected 5"),
        ("label\tid1\tid2\ttext1\ttext2", "label 'label' is not 0 or 1"),
        ("2\tA\tB\tx\ty", "label '2' is not 0 or 1"),
        ("0.5\tA\tB\tx\ty", "label '0.5' is not 0 or 1"),
        ("", "1 tab-separated columns"),
        ("1\tA\tB\tx\ty\tz", "6 tab-separated columns"),
    ],
)
def test_retrieval_malformed_rows_name_file_and_line(
    tmp_path: Path, bad_line: str, message: str
) -> None:
    rows = dict(AAN_ROWS, eval=["1\tE\tF\tabc\tdef", bad_line, "0\tG\tH\tx\ty"])
    folder = write_aan(tmp_path, rows)
    with pytest.raises(DataFormatError, match=message) as err:
        load_retrieval(folder)
    assert f"{folder / 'new_aan_pairs.eval.tsv'}, line 2:" in str(err.value)


def test_retrieval_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no AAN files found") as err:
        load_retrieval(tmp_path)
    assert f"{tmp_path} and {tmp_path / 'tsv_data'}" in str(err.value)
    write_aan(tmp_path / "tsv_data")
    (tmp_path / "tsv_data" / "new_aan_pairs.test.tsv").unlink()
    with pytest.raises(DataFormatError, match=r"lacks new_aan_pairs\.test\.tsv"):
        load_retrieval(tmp_path)


def test_retrieval_empty_file(tmp_path: Path) -> None:
    folder = write_aan(tmp_path)
    (folder / "new_aan_pairs.eval.tsv").write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"new_aan_pairs\.eval\.tsv is empty"):
        load_retrieval(folder)


def test_retrieval_reads_a_bom_and_trailing_blank_lines(tmp_path: Path) -> None:
    reference = load_retrieval(write_aan(tmp_path / "plain"), max_len=16)
    folder = write_aan(tmp_path / "edited")
    for path in folder.iterdir():
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes() + b"\r\n\n")
    again = load_retrieval(folder, max_len=16)
    for split in ("train", "valid", "test"):
        for key in ("tokens", "tokens2", "labels"):
            assert torch.equal(getattr(getattr(again, split), key),
                               getattr(getattr(reference, split), key))  # fmt: skip
