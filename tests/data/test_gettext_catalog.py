"""The .mo reader on catalogues written here in both byte orders, with contexts, plural
entries, a header, a non-UTF-8 charset and undecodable entries; malformed files raise."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kattn.data import DataFormatError
from kattn.data.gettext_catalog import MO_MAGIC, parse_mo, read_mo

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def mo_bytes(
    messages: list[tuple[bytes, bytes]], *, big_endian: bool = False, revision: int = 0
) -> bytes:
    """A .mo file of raw (original, translation) strings, sorted as msgfmt sorts them, with no
    hash table: header, two (length, offset) tables, then the NUL-terminated strings."""
    order = ">" if big_endian else "<"
    messages = sorted(messages)
    n = len(messages)
    originals_at = 28
    translations_at = originals_at + 8 * n
    strings_at = translations_at + 8 * n
    tables: list[list[int]] = [[], []]
    blob = b""
    for side in (0, 1):
        for message in messages:
            tables[side] += [len(message[side]), strings_at + len(blob)]
            blob += message[side] + b"\0"
    head = struct.pack(
        order + "7I", MO_MAGIC, revision, n, originals_at, translations_at, 0, strings_at
    )
    return head + struct.pack(f"{order}{4 * n}I", *tables[0], *tables[1]) + blob


def catalogue(charset: str = "UTF-8") -> list[tuple[bytes, bytes]]:
    header = HEADER.replace("UTF-8", charset)
    return [
        (b"", header.encode()),
        (b"Open", "Öffnen".encode()),
        (b"menu\x04Open", "Öffnen".encode()),
        (b"%d file\x00%d files", b"%d Datei\x00%d Dateien"),
        (b"Quit", b"Beenden"),
    ]


@pytest.mark.parametrize("big_endian", [False, True], ids=["little", "big"])
def test_reads_messages_contexts_and_plurals(tmp_path: Path, big_endian: bool) -> None:
    path = tmp_path / "app.mo"
    path.write_bytes(mo_bytes(catalogue(), big_endian=big_endian))
    catalog = read_mo(path)
    assert catalog.big_endian is big_endian
    assert catalog.charset == "utf-8"
    assert catalog.metadata["plural-forms"].startswith("nplurals=2")
    assert catalog.undecodable == 0
    by_key = {(e.context, e.msgid): e for e in catalog.entries}
    assert len(catalog.entries) == 4  # the header is not a message
    assert by_key[(None, "Open")].msgstr == "Öffnen"
    assert by_key[("menu", "Open")].msgstr == "Öffnen"
    plural = by_key[(None, "%d file")]
    assert plural.msgid_plural == "%d files"
    assert plural.msgstr == "%d Datei"
    assert plural.plural_forms == ("%d Datei", "%d Dateien")
    assert by_key[(None, "Quit")].plural_forms == ("Beenden",)
    assert by_key[(None, "Quit")].msgid_plural is None


def test_byte_orders_agree_and_revision_one_reads() -> None:
    little = parse_mo(mo_bytes(catalogue()))
    big = parse_mo(mo_bytes(catalogue(), big_endian=True, revision=1))
    assert little.entries == big.entries
    assert big.revision == 1


def test_undecodable_entries_are_counted_and_left_out() -> None:
    messages = [*catalogue(), (b"Save", b"Speichern \xff\xfe"), (b"Bad \xc3", b"x")]
    catalog = parse_mo(mo_bytes(messages))
    assert catalog.undecodable == 2
    assert {e.msgid for e in catalog.entries} == {"Open", "%d file", "Quit"}


def test_charset_of_the_header_is_used() -> None:
    messages = [
        (b"", HEADER.replace("UTF-8", "ISO-8859-1").encode()),
        (b"Open", "Öffnen".encode("latin-1")),
    ]
    catalog = parse_mo(mo_bytes(messages))
    assert catalog.charset == "iso8859-1"
    assert catalog.entries[0].msgstr == "Öffnen"


def test_malformed_files_raise_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="missing"):
        read_mo(tmp_path / "absent.mo")
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"\x00" * 40)
    with pytest.raises(DataFormatError, match=r"bad\.mo is not a gettext \.mo file"):
        read_mo(bad)
    with pytest.raises(DataFormatError, match="too short"):
        parse_mo(b"\xde\x12\x04\x95")
    data = bytearray(mo_bytes(catalogue()))
    struct.pack_into("<I", data, 8, 1000)  # N far beyond the file
    with pytest.raises(DataFormatError, match="runs past the end"):
        parse_mo(bytes(data))
    data = bytearray(mo_bytes(catalogue()))
    struct.pack_into("<I", data, 4, 2 << 16)
    with pytest.raises(DataFormatError, match="major revision 2"):
        parse_mo(bytes(data))
