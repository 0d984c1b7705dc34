"""ListOps: LRA's generator (window, de-duplication, labels), the released TSV format, and the
official and legacy tokenisations."""

from __future__ import annotations

import random

import pytest
import torch

from kattn.data import DataFormatError
from kattn.data.listops import (
    LISTOPS_FILES,
    LISTOPS_OOV_ID,
    LISTOPS_VOCAB_SIZE,
    encode_listops,
    generate_listops,
    generate_tree,
    load_listops,
    to_string,
    tokenize_listops,
    tree_value,
    write_listops,
)

SMALL = {"min_length": 20, "max_length": 100, "max_depth": 4}
MAX_29 = "( ( ( [MAX 2 ) 9 ) ] )"

# the released format, written by hand: [MAX 2 9 ], [MIN 4 [SM 5 8 ] 7 ], [MED 1 2 3 4 ] and
# a bare digit
FIXTURE = {
    "train": [
        (MAX_29, 9),
        ("( ( ( ( [MIN 4 ) ( ( ( [SM 5 ) 8 ) ] ) ) 7 ) ] )", 3),
    ],
    "valid": [("( ( ( ( ( [MED 1 ) 2 ) 3 ) 4 ) ] )", 2)],
    "test": [("7", 7)],
}


def evaluate(source: str) -> int:
    """The value of a serialised expression, by a stack over its tokens (independent of the
    generator's tree walk)."""
    stack: list[tuple[str, list[int]]] = []
    result: list[int] = []
    for token in source.split():
        if token in ("(", ")"):
            continue
        if token.startswith("["):
            stack.append((token, []))
            continue
        if token == "]":
            op, args = stack.pop()
            ordered = sorted(args)
            n = len(ordered)
            value = {
                "[MIN": ordered[0],
                "[MAX": ordered[-1],
                "[MED": (ordered[(n - 1) // 2] + ordered[n // 2]) // 2,
                "[SM": sum(args) % 10,
            }[op]
        else:
            value = int(token)
        (stack[-1][1] if stack else result).append(value)
    assert not stack and len(result) == 1, source
    return result[0]


def length(source: str) -> int:
    return sum(token not in ("(", ")") for token in source.split())


@pytest.fixture(scope="module")
def small() -> dict[str, list[tuple[str, int]]]:
    return generate_listops(300, 50, 50, seed=0, **SMALL)


def write_lines(folder, name: str, lines: list[str]) -> None:
    (folder / name).write_text("".join(line + "\r\n" for line in lines), encoding="utf-8")


@pytest.fixture
def fixture_dir(tmp_path):
    for split, name in LISTOPS_FILES.items():
        lines = ["Source\tTarget"] + [f"{s}\t{t}" for s, t in FIXTURE[split]]
        write_lines(tmp_path, name, lines)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# generator


def test_to_string_of_max_example():
    tree = ((("[MAX", 2), 9), "]")
    assert to_string(tree) == MAX_29
    assert tree_value(tree) == 9


def test_generate_tree_length_counts_tokens_without_parens():
    rng = random.Random(1)
    for _ in range(200):
        tree, n = generate_tree(rng, max_depth=5, max_args=6)
        assert n == length(to_string(tree))


def test_split_sizes(small):
    assert {k: len(v) for k, v in small.items()} == {"train": 300, "valid": 50, "test": 50}


def test_reproducible_with_seed_and_different_across_seeds(small):
    assert generate_listops(300, 50, 50, seed=0, **SMALL) == small
    assert generate_listops(300, 50, 50, seed=1, **SMALL) != small


def test_lengths_strictly_inside_window(small):
    lengths = [length(s) for split in small.values() for s, _ in split]
    assert all(20 < n < 100 for n in lengths)
    assert min(lengths) == 21  # the bound is strict but reachable


def test_examples_are_distinct_across_splits(small):
    sources = [s for split in small.values() for s, _ in split]
    assert len(set(sources)) == len(sources)


def test_duplicates_are_dropped_until_the_space_is_exhausted():
    # with max_depth=2, max_args=2 every kept tree is [OP d d ]: 4 * 10 * 10 = 400 of them
    data = generate_listops(400, 0, 0, min_length=3, max_length=5, max_depth=2, max_args=2)
    sources = [s for s, _ in data["train"]]
    assert len(set(sources)) == 400
    assert all(length(s) == 4 for s in sources)


def test_labels_match_independent_evaluator(small):
    examples = [e for split in small.values() for e in split]
    assert all(label == evaluate(source) for source, label in examples)
    operators = {t for s, _ in examples for t in s.split() if t.startswith("[")}
    assert operators == {"[MIN", "[MAX", "[MED", "[SM"}


def test_med_truncates_half_integers():
    tree = ((((("[MED", 1), 2), 3), 4), "]")  # median 2.5
    assert tree_value(tree) == 2 == evaluate(to_string(tree))


@pytest.mark.parametrize(
    "options, named",
    [
        ({"min_length": 50, "max_length": 51}, "max_length=51"),
        ({"min_length": 200, "max_length": 400, "max_depth": 3}, "max_depth=3"),
    ],
    ids=["empty-window", "beyond-longest-tree"],
)
def test_impossible_window_raises(options, named):
    with pytest.raises(ValueError, match="min_length") as err:
        generate_listops(10, 0, 0, **options)
    assert named in str(err.value)


def test_exhausted_window_raises_naming_options():
    # only [OP d d ] has length 4: 4 * 100 distinct expressions, fewer than asked for
    with pytest.raises(ValueError) as err:
        generate_listops(500, 0, 0, min_length=3, max_length=5, max_depth=2, max_args=2)
    message = str(err.value)
    for name in ("min_length=3", "max_length=5", "max_depth=2", "only 400 of 500"):
        assert name in message


# ---------------------------------------------------------------------------------------------
# files and loader


def test_written_tsv_round_trips(small, tmp_path):
    paths = write_listops(tmp_path, small)
    assert {p.name for p in paths.values()} == {
        "basic_train.tsv",
        "basic_val.tsv",
        "basic_test.tsv",
    }
    lines = paths["valid"].read_bytes().split(b"\r\n")
    assert lines[0] == b"Source\tTarget"
    assert lines[1] == f"{small['valid'][0][0]}\t{small['valid'][0][1]}".encode()
    assert lines[-1] == b"" and len(lines) == 50 + 2
    data = load_listops(tmp_path, max_len=128)
    for split, dataset in (("train", data.train), ("valid", data.valid), ("test", data.test)):
        expected = [encode_listops(s) for s, _ in small[split]]
        assert dataset.labels.tolist() == [label for _, label in small[split]]
        assert dataset.lengths.tolist() == [len(ids) for ids in expected]
        assert [
            row[:n].tolist() for row, n in zip(dataset.tokens, dataset.lengths, strict=True)
        ] == expected
    assert (data.task, data.vocab_size, data.num_classes, data.max_len) == ("listops", 17, 10, 128)
    assert data.info["truncated"] == {"train": 0, "valid": 0, "test": 0}


def test_official_and_legacy_tokens_and_ids():
    assert tokenize_listops(MAX_29) == ["[MAX", "2", "9", "X"]
    assert tokenize_listops(MAX_29, "legacy") == ["MAX", "2", "9"]
    assert encode_listops(MAX_29) == [2, 8, 15, 5]
    assert encode_listops(MAX_29, "legacy") == [2, 8, 15]
    with pytest.raises(ValueError, match="tokenization"):
        encode_listops(MAX_29, "bpe")


def test_released_fixture_loads_padded(fixture_dir):
    data = load_listops(fixture_dir, max_len=12)
    assert data.train.tokens.shape == (2, 12) and data.train[0]["tokens"].dtype == torch.int64
    # [MIN 4 [SM 5 8 ] 7 ]
    assert data.train.tokens[1].tolist() == [1, 10, 4, 11, 14, 5, 13, 5] + [0] * 4
    assert data.train.lengths.tolist() == [4, 8]
    assert data.train.labels.tolist() == [9, 3]
    assert data.valid.labels.tolist() == [2] and data.test.tokens[0].tolist() == [13] + [0] * 11
    mask = data.train.padding_mask(data.train.tokens, data.train.lengths, pad_id_mask=False)
    assert mask.sum(dim=1).tolist() == [8, 4]


def test_legacy_drops_brackets_on_load(fixture_dir):
    data = load_listops(fixture_dir, tokenization="legacy", max_len=12)
    assert data.train.tokens[1].tolist() == [1, 10, 4, 11, 14, 13] + [0] * 6
    assert data.vocab_size == LISTOPS_VOCAB_SIZE
    assert "bracket" in data.info["tokenisation"]


def test_lra_release_root_is_accepted(fixture_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lra_release")
    (root / "listops-1000").mkdir()
    for name in LISTOPS_FILES.values():
        (root / "listops-1000" / name).write_bytes((fixture_dir / name).read_bytes())
    assert load_listops(root).train.labels.tolist() == [9, 3]


def test_truncation_is_counted(fixture_dir):
    data = load_listops(fixture_dir, max_len=5)
    assert data.train.lengths.tolist() == [4, 5]
    assert data.train.tokens[1].tolist() == [1, 10, 4, 11, 14]
    assert data.info["truncated"] == {"train": 1, "valid": 1, "test": 0}


def test_unknown_tokens_get_oov_id_and_are_counted(fixture_dir):
    lines = ["Source\tTarget", "( ( ( [FIRST 2 ) 9 ) ] )\t2"]
    write_lines(fixture_dir, "basic_test.tsv", lines)
    with pytest.warns(UserWarning, match=r"\[FIRST"):
        data = load_listops(fixture_dir)
    assert data.test.tokens[0, :4].tolist() == [LISTOPS_OOV_ID, 8, 15, 5]
    assert data.info["oov_tokens"] == {"train": 0, "valid": 0, "test": 1}
    assert data.info["unknown_tokens"] == ["[FIRST"]


def test_missing_file_names_it(fixture_dir):
    (fixture_dir / "basic_val.tsv").unlink()
    with pytest.raises(DataFormatError, match=r"basic_val\.tsv") as err:
        load_listops(fixture_dir)
    assert "basic_train.tsv" in str(err.value)  # says what the folder should hold


def test_empty_folder_says_what_was_expected(tmp_path):
    with pytest.raises(DataFormatError, match="listops-1000"):
        load_listops(tmp_path)


@pytest.mark.parametrize(
    "lines, where, expected",
    [
        (["Source,Target", f"{MAX_29}\t9"], "line 1", "Source"),
        (["Source\tTarget", f"{MAX_29}\t9", f"{MAX_29}"], "line 3", "expected 2"),
        (["Source\tTarget", f"{MAX_29}\t9\t1"], "line 2", "expected 2"),
        (["Source\tTarget", f"{MAX_29}\t12"], "line 2", "0-9"),
        (["Source\tTarget", f"{MAX_29}\tnine"], "line 2", "0-9"),
        (["Source\tTarget", " \t4"], "line 2", "empty"),
        (["Source\tTarget"], "basic_test.tsv holds no examples", "header"),
    ],
    ids=["header", "one-column", "three-columns", "target-12", "target-word", "no-source", "empty"],
)
def test_malformed_line_names_file_and_line(fixture_dir, lines, where, expected):
    write_lines(fixture_dir, "basic_test.tsv", lines)
    with pytest.raises(DataFormatError) as err:
        load_listops(fixture_dir)
    message = str(err.value)
    assert "basic_test.tsv" in message and where in message and expected in message


def test_bad_options_raise(fixture_dir, small, tmp_path):
    with pytest.raises(ValueError, match="max_len"):
        load_listops(fixture_dir, max_len=0)
    with pytest.raises(ValueError, match="tokenization"):
        load_listops(fixture_dir, tokenization="tfds")
    with pytest.raises(ValueError, match="keys"):
        write_listops(tmp_path, {"train": small["train"], "val": [], "test": []})
    with pytest.raises(ValueError, match="0-9"):
        write_listops(tmp_path, {"train": [(MAX_29, 10)], "valid": [], "test": []})


@pytest.mark.parametrize(
    "bom, tail",
    [("\ufeff", ""), ("", "\r\n"), ("", "\n\n"), ("\ufeff", "\r\n  \r\n")],
    ids=["bom", "blank-line-crlf", "blank-lines-lf", "bom-and-blank-lines"],
)
def test_a_bom_and_trailing_blank_lines_are_read(fixture_dir, bom, tail):
    """What an editor or a spreadsheet export may leave in the released TSV files: a UTF-8
    byte-order mark before the header, empty lines after the last row."""
    reference = load_listops(fixture_dir)
    for name in LISTOPS_FILES.values():
        path = fixture_dir / name
        path.write_bytes(bom.encode() + path.read_bytes() + tail.encode())
    data = load_listops(fixture_dir)
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(data, split).tokens, getattr(reference, split).tokens)
        assert torch.equal(getattr(data, split).labels, getattr(reference, split).labels)
    assert data.info["examples"] == {"train": 2, "valid": 1, "test": 1}


def test_an_empty_line_between_rows_is_an_error(fixture_dir):
    write_lines(fixture_dir, "basic_train.tsv", ["Source\tTarget", f"{MAX_29}\t9", "", "7\t7"])
    with pytest.raises(DataFormatError, match=r"basic_train\.tsv, line 3: an empty line between"):
        load_listops(fixture_dir)
