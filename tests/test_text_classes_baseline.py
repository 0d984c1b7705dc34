"""benchmarks/text_classes_baseline.py: naive Bayes over byte n-grams on a set in AG News's
layout written here, against hand-checkable cases."""

from __future__ import annotations

import json
from pathlib import Path

from .test_benchmark_scripts import import_benchmark


def test_byte_grams_and_naive_bayes() -> None:
    baseline = import_benchmark("text_classes_baseline")
    assert baseline.byte_grams("ab", 1).tolist() == [97, 98]
    assert baseline.byte_grams("abc", 2).tolist() == [97 * 256 + 98, 98 * 256 + 99]
    assert baseline.byte_grams("a", 2).tolist() == []
    # "x" only in class 0, "y" only in class 1: bytes decide every test text
    train, labels = ["xx x", "x xx", "yy y", "y yy"], [0, 0, 1, 1]
    assert baseline.naive_bayes_accuracy(train, labels, ["xxx", "yyy"], [0, 1], 1) == 1.0
    # bigrams tell "ab" from "ba", single bytes cannot
    train, labels = ["ab ab", "abab", "ba ba", "baba"], [0, 0, 1, 1]
    assert baseline.naive_bayes_accuracy(train, labels, ["abab", "baba"], [0, 1], 2) == 1.0


def test_the_script_writes_its_result(tmp_path: Path) -> None:
    rows = [f'"{i % 2 + 1}","","{"xy" if i % 2 else "ab"} text {i}"' for i in range(40)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "test.csv").write_text("\n".join(rows[:10]) + "\n", encoding="utf-8")
    out = tmp_path / "out.json"
    import_benchmark("text_classes_baseline").main(["--data", str(tmp_path), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["train_examples"] == 36 and result["test_examples"] == 10  # a tenth held out
    assert result["majority_accuracy"] == 0.5
    assert result["naive_bayes_byte_bigrams_accuracy"] == 1.0
