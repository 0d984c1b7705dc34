"""Parallel text: the gettext corpus (filters, de-duplication, hash split stable when a
catalogue is added, manifest), the IWSLT'14 and plain-file loaders and their errors, and the
real en–de catalogues of this machine when it has them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kattn.data import DataFormatError
from kattn.data.parallel import (
    LOCALE_ROOT,
    filter_pairs,
    gettext_corpus,
    load_iwslt,
    load_parallel_files,
    normalise,
    placeholders,
    split_of,
)

from .test_gettext_catalog import HEADER, mo_bytes

WORDS = (
    "the", "red", "cat", "sees", "a", "small", "dog", "near", "an", "old", "house", "with",
    "blue", "windows",
)  # fmt: skip


def messages(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """``n`` distinct English sentences with a made-up "translation" (upper case)."""
    out = [(b"", HEADER.encode())]
    for i in range(start, start + n):
        text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 5)) + f" {i}"
        out.append((text.encode(), text.upper().encode()))
    return out


def write_catalogue(
    root: Path, name: str, msgs: list[tuple[bytes, bytes]], lang: str = "de"
) -> Path:
    folder = root / lang / "LC_MESSAGES"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(mo_bytes(msgs, big_endian=name.startswith("big")))
    return folder / name


def test_placeholders_and_accelerators() -> None:
    assert placeholders("%s of %1$s, %-5.2lf %% %(name)s") == placeholders(
        "%(name)s %1$s %% %s %-5.2lf"
    )
    assert sorted(placeholders("{0} {name} ${HOME} $PATH <b>x</b> {}").elements()) == sorted(
        ["{0}", "{name}", "${HOME}", "$PATH", "<b>", "</b>", "{}"]
    )
    assert placeholders("%d files") != placeholders("%s Dateien")
    assert placeholders("100 files") == placeholders("100 Dateien")  # no placeholder at all
    assert normalise("_Open  the\n&File ~Edit") == "Open the File Edit"
    assert normalise("snake_case __init__ Tom & Jerry &amp; a_b") == (
        "snake_case __init__ Tom & Jerry &amp; a_b"
    )


def test_filters_count_each_step() -> None:
    pairs = [
        ("Open %s", "%s öffnen"),  # kept (placeholders reordered)
        ("_Quit", "_Beenden"),  # kept, accelerators stripped
        ("Copy %d", "Kopiere %s"),  # placeholder mismatch
        ("Untranslated", ""),  # empty
        ("GNU", "GNU"),  # identical
        ("word " * 20, "Wort " * 20),  # too many words
        ("Save", "Sichern"),  # duplicates: the most frequent wins
        ("Save", "Speichern"),
        ("Save", "Speichern"),
        ("Print", "Zeta"),  # tie: the smallest string wins
        ("Print", "Drucken"),
    ]
    kept, counts = filter_pairs(pairs, max_chars=300, max_words=10)
    assert counts == {
        "read": 11,
        "normalised": 11,
        "nonempty": 10,
        "translated": 9,
        "placeholders": 8,
        "length": 7,
        "deduplicated": 4,
    }
    assert kept == [
        ("Open %s", "%s öffnen"),
        ("Print", "Drucken"),
        ("Quit", "Beenden"),
        ("Save", "Speichern"),
    ]
    kept, counts = filter_pairs([("a b c", "x"), ("abcdefgh", "y")], max_chars=5, max_words=2)
    assert kept == [] and counts["length"] == 0


def test_gettext_corpus_reads_both_orders_plurals_and_contexts(tmp_path: Path) -> None:
    msgs = [
        *messages(30),
        (b"ctx\x04Open the file", "Die Datei öffnen".encode()),
        (b"%d new file\x00%d new files", b"%d neue Datei\x00%d neue Dateien"),
    ]
    write_catalogue(tmp_path, "little.mo", msgs)
    write_catalogue(tmp_path, "big.mo", messages(20, start=100))
    corpus = gettext_corpus("en", "de", tmp_path, fractions=(0.5, 0.25, 0.25))
    pairs = corpus.train + corpus.valid + corpus.test
    assert corpus.manifest["counts"]["read"] == 52
    assert ("Open the file", "Die Datei öffnen") in pairs
    assert ("%d new file", "%d neue Datei") in pairs
    assert ("%d new files", "%d neue Dateien") not in pairs
    both = gettext_corpus("en", "de", tmp_path, plurals="both")
    assert both.manifest["counts"]["read"] == 53
    assert ("%d new files", "%d neue Dateien") in both.train + both.valid + both.test
    assert min(corpus.sizes().values()) > 0 and sum(corpus.sizes().values()) == 52
    for name in ("train", "valid", "test"):  # every pair in the split of its English side
        assert all(split_of(s, (0.5, 0.25, 0.25)) == name for s, _ in corpus.split(name))
    reverse = gettext_corpus("de", "en", tmp_path, fractions=(0.5, 0.25, 0.25))
    assert reverse.valid == [(t, s) for s, t in corpus.valid]  # same split, sides swapped


def test_split_is_stable_when_a_catalogue_is_added(tmp_path: Path) -> None:
    write_catalogue(tmp_path, "a.mo", messages(60))
    before = gettext_corpus(root=tmp_path, fractions=(0.6, 0.2, 0.2))
    write_catalogue(tmp_path, "b.mo", messages(60, start=60))
    after = gettext_corpus(root=tmp_path, fractions=(0.6, 0.2, 0.2))
    assert sum(after.sizes().values()) == 120
    for name in ("train", "valid", "test"):
        assert set(before.split(name)) <= set(after.split(name))


def test_manifest_lists_files_with_hashes(tmp_path: Path) -> None:
    paths = [
        write_catalogue(tmp_path, name, messages(10, start=10 * k))
        for k, name in enumerate(("a.mo", "big.mo"))
    ]
    write_catalogue(tmp_path, "ignored.mo", messages(5), lang="de_CH")
    manifest = gettext_corpus(root=tmp_path).manifest
    assert [f["file"] for f in manifest["files"]] == ["a.mo", "big.mo"]  # de_CH not read
    listed = {f["file"]: f for f in manifest["files"]}
    for path in paths:
        assert listed[path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert listed[path.name]["messages"] == 10
    assert sum(manifest["splits"].values()) == manifest["counts"]["deduplicated"] == 20


def test_missing_catalogues_name_the_data_option(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="--data"):
        gettext_corpus("en", "xx", tmp_path)
    with pytest.raises(DataFormatError, match="one side must be 'en'"):
        gettext_corpus("fr", "de", tmp_path)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_iwslt_layout(tmp_path: Path) -> None:
    for name, n in (("train", 8), ("valid", 3), ("test", 2)):
        write_lines(tmp_path / f"{name}.de", [f"satz {name} {i} ." for i in range(n)])
        write_lines(tmp_path / f"{name}.en", [f"sentence {name} {i} ." for i in range(n)])
    corpus = load_iwslt(tmp_path, "de", "en")
    assert corpus.sizes() == {"train": 8, "valid": 3, "test": 2}
    assert corpus.valid[1] == ("satz valid 1 .", "sentence valid 1 .")
    assert len(corpus.manifest["files"]) == 6
    swapped = load_iwslt(tmp_path, "en", "de")
    assert swapped.test[0] == ("sentence test 0 .", "satz test 0 .")
    write_lines(tmp_path / "valid.en", ["a", "b"])
    with pytest.raises(DataFormatError, match=r"valid\.en ends after line 2 .* 3 lines"):
        load_iwslt(tmp_path)
    (tmp_path / "test.de").unlink()
    write_lines(tmp_path / "valid.en", ["a", "b", "c"])
    with pytest.raises(DataFormatError, match=r"test\.de is missing"):
        load_iwslt(tmp_path)
    with pytest.raises(DataFormatError, match="not a folder"):
        load_iwslt(tmp_path / "nowhere")


def test_plain_files_split_by_hash_and_errors(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "a.en", [f"line {i}" for i in range(50)] + ["", "x"])
    tgt = write_lines(tmp_path / "a.de", [f"Zeile {i}" for i in range(50)] + ["leer", ""])
    corpus = load_parallel_files(src, tgt, "en", "de", fractions=(0.6, 0.2, 0.2))
    assert sum(corpus.sizes().values()) == 50 and corpus.manifest["empty"] == 2
    assert all(split_of(s, (0.6, 0.2, 0.2)) == "test" for s, _ in corpus.test)
    assert corpus.manifest["files"][0]["lines"] == 52
    write_lines(tgt, ["eins", "zwei", "drei"])
    with pytest.raises(DataFormatError, match=r"a\.de ends after line 3 but .*a\.en has 52"):
        load_parallel_files(src, tgt, "en", "de")
    tgt.write_bytes(b"ok\nbad \xff\n")
    with pytest.raises(DataFormatError, match=r"a\.de, line 2: not valid UTF-8"):
        load_parallel_files(src, tgt, "en", "de")
    with pytest.raises(DataFormatError, match="missing"):
        load_parallel_files(src, tmp_path / "none.de", "en", "de")


def test_real_english_german_catalogues() -> None:
    folder = Path(LOCALE_ROOT) / "de" / "LC_MESSAGES"
    if not list(folder.glob("*.mo")):
        pytest.skip(f"this machine has no German gettext catalogues under {folder}")
    corpus = gettext_corpus("en", "de")
    manifest = corpus.manifest
    total = sum(corpus.sizes().values())
    print(f"en–de gettext corpus: counts {manifest['counts']}, splits {manifest['splits']}")
    assert 10_000 <= total < 100_000
    assert len(corpus.valid) > 300 and len(corpus.test) > 300
    assert {f["file"] for f in manifest["files"]} == {p.name for p in folder.glob("*.mo")}
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    counts = list(manifest["counts"].values())
    assert counts == sorted(counts, reverse=True) and counts[-1] == total
