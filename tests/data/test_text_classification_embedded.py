"""The embedded text-classification set built from .mo catalogues written here: the filter,
cross-domain deduplication, balanced classes, seeded disjoint splits, the manifest's hashes,
the read-back through the AG News loader, the cache folder, and too few catalogues."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kattn.data import DataFormatError
from kattn.data import text_classification_embedded as embedded
from kattn.data.agnews import load_agnews
from kattn.data.text_classification_embedded import generate_text_classes
from tests.data.test_gettext_catalog import mo_bytes

PARAMS = {"domains": ["alpha", "beta", "gamma-*"], "per_class": 6, "min_chars": 10,
          "max_chars": 80, "test_fraction": 0.5, "min_domain_texts": 5, "min_classes": 3,
          "seed": 0}  # fmt: skip


def write_catalogues(root: Path) -> None:
    """Three domains (gamma in two versions) in two languages; each language holds part of a
    domain's messages; one message is in three domains, spelt with other quotes, placeholders
    and case; gamma spells one message twice; one has a backslash, one is short."""
    header = (b"", b"Content-Type: text/plain; charset=UTF-8\n")
    messages = {
        "alpha": [f"alpha message number {i}" for i in range(8)],
        "beta": [f"beta sentence {i} here" for i in range(7)] + ["Shared “between” programs: %s"],
        "gamma-1": [f"old gamma {i} text" for i in range(9)],
        "gamma-2": [f"gamma line {i} text" for i in range(9)]
        + [
            "shared between 'programs'",
            "Gamma Line 0 TEXT: %-5lu",
            "a back\\slash one",
            "too short",
        ],
    }
    for lang, part in (("de", slice(0, None, 2)), ("fr", slice(1, None, 2))):
        folder = root / lang / "LC_MESSAGES"
        folder.mkdir(parents=True)
        for domain, texts in messages.items():
            chosen = texts[part] + ["shared between programs"] * (domain == "alpha")
            entries = [header] + [(t.encode(), t.upper().encode()) for t in set(chosen)]
            (folder / f"{domain}.mo").write_bytes(mo_bytes(entries))


def test_generates_balanced_disjoint_classes(tmp_path: Path) -> None:
    write_catalogues(tmp_path / "locale")
    manifest = generate_text_classes(tmp_path / "set", tmp_path / "locale", **PARAMS)
    assert manifest["classes"] == ["alpha", "beta", "gamma-2"]  # the highest gamma version
    # "shared between programs" (alpha, beta, gamma-2, with other quotes and a placeholder) is
    # dropped everywhere; gamma keeps one of its two spellings of "gamma line 0 text"; the
    # backslash and short ones are left out
    assert manifest["texts_per_domain"] == {"alpha": 8, "beta": 7, "gamma-2": 9}
    data = load_agnews(tmp_path / "set")
    assert data.classes == ("alpha", "beta", "gamma-2")
    texts = data.train.texts + data.test.texts
    labels = data.train.labels + data.test.labels
    assert len(texts) == len(set(texts)) == 3 * 6  # per class: min(6, smallest domain)
    assert not set(data.train.texts) & set(data.test.texts)
    assert [labels.count(c) for c in range(3)] == [6, 6, 6]
    assert data.test.labels.count(0) == 3  # half of each class in test
    for text, label in zip(texts, labels, strict=True):
        assert text.split()[0].lower().startswith(data.classes[label].split("-")[0])
        assert "shared" not in text and "\\" not in text
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((tmp_path / "set" / name).read_bytes()).hexdigest() == digest
    assert json.loads((tmp_path / "set" / "manifest.json").read_text()) == manifest


def test_seeded(tmp_path: Path) -> None:
    write_catalogues(tmp_path / "locale")
    generate_text_classes(tmp_path / "a", tmp_path / "locale", **PARAMS)
    generate_text_classes(tmp_path / "b", tmp_path / "locale", **PARAMS)
    generate_text_classes(tmp_path / "c", tmp_path / "locale", **{**PARAMS, "seed": 1})
    read = {k: (tmp_path / k / "train.csv").read_bytes() for k in "abc"}
    assert read["a"] == read["b"] != read["c"]


def test_too_few_catalogues(tmp_path: Path) -> None:
    write_catalogues(tmp_path / "locale")
    with pytest.raises(DataFormatError, match="needs 4: give a set in AG News's layout"):
        generate_text_classes(tmp_path / "x", tmp_path / "locale", **{**PARAMS, "min_classes": 4})


def test_cached_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_catalogues(tmp_path / "locale")
    monkeypatch.setenv("KATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "EMBEDDED_TEXT_CLASSES", PARAMS)
    folder = embedded.embedded_text_classes(tmp_path / "locale")
    assert folder.parent == tmp_path / "cache" and (folder / "manifest.json").is_file()
    stamp = (folder / "train.csv").stat().st_mtime_ns
    assert embedded.embedded_text_classes(tmp_path / "locale") == folder
    assert (folder / "train.csv").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]  # no .tmp left
