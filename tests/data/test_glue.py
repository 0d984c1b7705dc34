"""GLUE loaders on small files written here in each task's released TSV layout (tabs, no
quote character, CoLA without a header, MNLI's two dev sets), pair encoding as
[CLS] a [SEP] b [SEP], and damaged files naming file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kattn.data import DataFormatError
from kattn.data.glue import GLUE_TASKS, glue_task, load_glue
from kattn.data.text_examples import SpecialIds, TextExamples, encode_examples, hold_out

MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")  # fmt: skip

#: task folder → file → lines, as the GLUE release writes them.
RELEASE = {
    "CoLA": {
        "train.tsv": ["gj04\t1\t\tOur friends won't buy this analysis.",
                      'gj04\t0\t*\tThey drank the pub "dry".'],
        "dev.tsv": ["gj04\t1\t\tThe sailors rode the breeze clear of the rocks."],
    },
    "SST-2": {
        "train.tsv": ["sentence\tlabel", "hide new secretions \t0", 'a "gorgeous" film \t1'],
        "dev.tsv": ["sentence\tlabel", "it 's a charming journey . \t1"],
    },
    "MRPC": {
        "train.tsv": ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                      "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him ."],
        "dev.tsv": ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                    "0\t1\t2\tHe said \"no\".\tShe said yes."],
    },
    "STS-B": {
        "train.tsv": ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                      "sentence2\tscore",
                      "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking "
                      "off.\tAn air plane is taking off.\t5.000"],
        "dev.tsv": ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                    "sentence2\tscore",
                    "0\tmain\tMSRvid\t2012\t0\tnone\tnone\tA man plays.\tA dog runs.\t0.500"],
    },
    "QQP": {
        "train.tsv": ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                      "133273\t213221\t213222\tHow is the life?\tWhat is life?\t0"],
        "dev.tsv": ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                    "1\t2\t3\tWhy?\tWhy not?\t1"],
    },
    "MNLI": {
        "train.tsv": [MNLI_HEAD + "\tlabel1\tgold_label",
                      "0\t31193\t31193n\tgov\t(a)\t(b)\t(A)\t(B)\tConceptually cream skimming."
                      "\tProduct and geography.\tneutral\tneutral"],
        "dev_matched.tsv": [MNLI_HEAD + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
                            "0\t1\t1e\tfiction\t(a)\t(b)\t(A)\t(B)\tThe new rights.\tEveryone "
                            "loves them.\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral"],
        "dev_mismatched.tsv": [MNLI_HEAD + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5"
                               "\tgold_label",
                               "0\t1\t1c\tletters\t(a)\t(b)\t(A)\t(B)\tYour gift.\tNo gift."
                               "\tcontradiction\tcontradiction\tcontradiction\tcontradiction"
                               "\tcontradiction\tcontradiction"],
    },
    "QNLI": {
        "train.tsv": ["index\tquestion\tsentence\tlabel",
                      "0\tWhen?\tIn 1990.\tentailment", "1\tWho?\tNobody.\tnot_entailment"],
        "dev.tsv": ["index\tquestion\tsentence\tlabel", "0\tWhere?\tHere.\tentailment"],
    },
    "RTE": {
        "train.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tA b.\tC d.\tnot_entailment"],
        "dev.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tE f.\tG h.\tentailment"],
    },
    "WNLI": {
        "train.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tI x.\tJ y.\t1"],
        "dev.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tK z.\tL w.\t0"],
    },
}  # fmt: skip


def write_release(root: Path, tasks: tuple[str, ...] = tuple(RELEASE)) -> Path:
    for task in tasks:
        folder = root / task
        folder.mkdir(parents=True)
        for file, lines in RELEASE[task].items():
            (folder / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_every_task_reads_its_columns(tmp_path: Path) -> None:
    root = write_release(tmp_path)
    seen = {}
    for key, spec in GLUE_TASKS.items():
        data = load_glue(root, key)  # the folder holding the task folders
        assert data.folder == root / spec.name
        assert [name for name, _ in spec.dev] == list(data.dev)
        seen[spec.name] = data
    cola = seen["CoLA"]
    assert cola.train.texts == ["Our friends won't buy this analysis.", 'They drank the pub "dry".']
    assert cola.train.labels == [1, 0] and cola.train.pairs is None
    assert seen["SST-2"].train.texts[1] == 'a "gorgeous" film '  # quotes are text
    assert seen["SST-2"].train.labels == [0, 1]
    mrpc = seen["MRPC"]
    assert (mrpc.train.texts, mrpc.train.pairs, mrpc.train.labels) == (
        ["Amrozi accused his brother ."],
        ["Referring to him ."],
        [1],
    )
    assert seen["MRPC"].dev["dev"].texts == ['He said "no".']
    stsb = seen["STS-B"]
    assert stsb.train.labels == [5.0] and stsb.dev["dev"].labels == [0.5]
    assert stsb.train.pairs == ["An air plane is taking off."]
    assert seen["QQP"].train.pairs == ["What is life?"]
    mnli = seen["MNLI"]
    assert mnli.train.labels == [2]  # neutral
    assert mnli.dev["matched"].labels == [2] and mnli.dev["mismatched"].labels == [0]
    assert mnli.dev["mismatched"].pairs == ["No gift."]
    assert seen["QNLI"].train.labels == [0, 1]
    assert seen["RTE"].dev["dev"].labels == [0]
    assert seen["WNLI"].train.texts == ["I x."]


def test_task_names_and_folder(tmp_path: Path) -> None:
    assert glue_task("SST-2") is glue_task("sst2") is GLUE_TASKS["sst2"]
    assert glue_task("STS-B").regression and not glue_task("cola").regression
    with pytest.raises(ValueError, match="CoLA, SST-2"):
        glue_task("squad")
    write_release(tmp_path, ("RTE",))
    assert load_glue(tmp_path / "RTE", "rte").train.texts == ["A b."]  # the task folder itself
    with pytest.raises(DataFormatError, match="no GLUE CoLA files"):
        load_glue(tmp_path, "cola")


@pytest.mark.parametrize(
    ("task", "file", "line", "match"),
    [
        ("SST-2", "train.tsv", "a fine film\t2", r"line 4: label '2' is not one of 0, 1"),
        ("CoLA", "dev.tsv", "gj04\t1\tThe sailors.", r"line 2: 3 tab-separated fields, expected 4"),
        ("STS-B", "dev.tsv", "1\tm\tf\ty\t0\tn\tn\tA.\tB.\t5.5", r"line 3: score '5.5' is not"),
        ("MNLI", "dev_matched.tsv", "\t".join(["x"] * 15) + "\t-", r"line 3: label '-'"),
    ],
)
def test_damaged_rows_name_file_and_line(
    tmp_path: Path, task: str, file: str, line: str, match: str
) -> None:
    write_release(tmp_path, (task,))
    with (tmp_path / task / file).open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    with pytest.raises(DataFormatError, match=match) as err:
        load_glue(tmp_path, task)
    assert file in str(err.value)


def test_header_must_name_the_columns(tmp_path: Path) -> None:
    write_release(tmp_path, ("QNLI",))
    (tmp_path / "QNLI" / "dev.tsv").write_text("index\tq\ts\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(DataFormatError, match=r"dev.tsv, line 1: the header must name"):
        load_glue(tmp_path, "qnli")


def test_pairs_encode_as_cls_a_sep_b_sep() -> None:
    special = SpecialIds(pad=0, cls=300, sep=301)
    examples = TextExamples(["ab", "abcdefgh"], [1, 0], ["xyz", "q"])
    data, cut = encode_examples(examples, lambda t: [ord(c) for c in t], special, max_len=9)
    a, b, x, y, z = (ord(c) for c in "abxyz")
    assert data.tokens[0].tolist() == [300, a, b, 301, x, y, z, 301, 0]
    assert data.lengths.tolist() == [8, 9]
    # too long: the longer text loses its end first, the pair keeps both texts
    assert data.tokens[1].tolist() == [300, *(ord(c) for c in "abcde"), 301, ord("q"), 301]
    assert cut == 1 and data.labels.tolist() == [1, 0]
    single, cut = encode_examples(TextExamples(["hello"], [2.5]), lambda t: [1] * len(t),
                                  special, max_len=4)  # fmt: skip
    assert single.tokens[0].tolist() == [300, 1, 1, 301] and cut == 1
    assert single.labels.dtype.is_floating_point


def test_hold_out_is_seeded_and_disjoint() -> None:
    kept, held = hold_out(100, 0.1, seed=3)
    assert len(held) == 10 and not set(kept) & set(held) and len(kept) + len(held) == 100
    assert hold_out(100, 0.1, seed=3) == (kept, held)
    assert hold_out(100, 0.1, seed=4)[1] != held
    assert len(hold_out(1000, 0.5, seed=0, cap=7)[1]) == 7
    with pytest.raises(ValueError, match="leaves a part empty"):
        hold_out(3, 0.01, seed=0)
