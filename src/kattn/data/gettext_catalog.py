"""A reader of GNU gettext message catalogues (``.mo`` files), the compiled translation tables
installed under ``/usr/share/locale/<lang>/LC_MESSAGES/``.

The format (GNU gettext manual, "The Format of GNU MO Files"): a header of 32-bit integers in
the file's byte order — magic ``0x950412de`` (read as ``0xde120495`` in the other order),
revision, N strings, offset of the original-strings table, offset of the translations table,
hash-table size and offset — then two tables of N ``(length, offset)`` pairs pointing at
NUL-terminated strings. An original string is ``msgctxt \\x04 msgid`` when it has a context
and ``msgid \\x00 msgid_plural`` when it has plural forms; its translation then holds the
forms ``msgstr[0] \\x00 msgstr[1] ...``. The entry with an empty msgid is the catalogue's
header (``Content-Type``, ``Plural-Forms``...), not a message.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .base import DataFormatError

#: the magic number of a .mo file, read in the file's own byte order.
MO_MAGIC = 0x950412DE
#: separates msgctxt from msgid in an original string.
CONTEXT_SEPARATOR = "\x04"
#: separates msgid from msgid_plural, and the plural forms of a translation.
PLURAL_SEPARATOR = "\x00"


@dataclass(frozen=True)
class MoEntry:
    """One message of a catalogue.

    Attributes:
        msgid: the original (source-language) text.
        msgstr: the translation; for a plural entry, its first form (``msgstr[0]``).
        context: the ``msgctxt`` that disambiguates the msgid, or None.
        msgid_plural: the plural original of a plural entry, or None.
        plural_forms: every translated form of a plural entry (``msgstr[0]``, ``msgstr[1]``,
            ...); ``(msgstr,)`` for a singular one.
    """

    msgid: str
    msgstr: str
    context: str | None = None
    msgid_plural: str | None = None
    plural_forms: tuple[str, ...] = ()


@dataclass
class MoCatalog:
    """The messages of one ``.mo`` file.

    Attributes:
        path: the file read.
        entries: the messages in the file's (msgid-sorted) order, header left out.
        header: the header entry's text (``"Content-Type: ...\\n..."``), empty if absent.
        revision: the format revision (major in the high 16 bits; 0 and 1 are readable).
        big_endian: the file's byte order.
        undecodable: how many entries were left out because their msgid or msgstr is not
            valid in the catalogue's charset.
    """

    path: Path
    entries: list[MoEntry]
    header: str = ""
    revision: int = 0
    big_endian: bool = False
    undecodable: int = 0
    charset: str = "utf-8"
    metadata: dict[str, str] = field(default_factory=dict)


def read_mo(path: str | Path) -> MoCatalog:
    """The messages of the ``.mo`` file at ``path``.

    Strings are decoded in the charset the header names (UTF-8 when it names none, as every
    catalogue on a current system is); an entry that does not decode is left out and counted
    in ``undecodable``.

    Raises:
        DataFormatError: the file is missing, not a .mo file, of an unknown major revision, or
            its tables point outside it; the message names the file.
    """
    file = Path(path)
    if not file.is_file():
        raise DataFormatError(f"{file} is missing: expected a gettext .mo catalogue there")
    return parse_mo(file.read_bytes(), file)


def parse_mo(data: bytes, path: str | Path = "<bytes>") -> MoCatalog:
    """The messages of the ``.mo`` bytes ``data`` (``path`` names them in errors); see
    :func:`read_mo`."""
    file = Path(path)
    if len(data) < 20:
        raise DataFormatError(f"{file}: {len(data)} bytes is too short for a .mo header")
    if struct.unpack("<I", data[:4])[0] == MO_MAGIC:
        order, big = "<", False
    elif struct.unpack(">I", data[:4])[0] == MO_MAGIC:
        order, big = ">", True
    else:
        raise DataFormatError(
            f"{file} is not a gettext .mo file: its first 4 bytes {data[:4].hex()} are not the "
            f"magic 0x950412de in either byte order"
        )
    revision, count, originals_at, translations_at = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 > 1:
        raise DataFormatError(f"{file}: .mo major revision {revision >> 16} is not readable")
    originals = _strings(data, order, originals_at, count, file)
    translations = _strings(data, order, translations_at, count, file)
    header_raw = next((t for o, t in zip(originals, translations, strict=True) if o == b""), b"")
    header = header_raw.decode("utf-8", errors="replace")
    metadata = _metadata(header)
    charset = _charset(metadata.get("content-type", ""))
    entries, undecodable = [], 0
    for original, translation in zip(originals, translations, strict=True):
        if original == b"":
            continue
        try:
            entries.append(_entry(original.decode(charset), translation.decode(charset)))
        except UnicodeDecodeError:
            undecodable += 1
    return MoCatalog(file, entries, header, revision, big, undecodable, charset, metadata)


# ------------------------------------------------------------------------------------ helpers
def _strings(data: bytes, order: str, table_at: int, count: int, file: Path) -> list[bytes]:
    """The ``count`` strings of the ``(length, offset)`` table at ``table_at``."""
    end = table_at + 8 * count
    if end > len(data):
        raise DataFormatError(
            f"{file}: a string table of {count} entries at offset {table_at} runs past the "
            f"end of the file ({len(data)} bytes)"
        )
    pairs = struct.unpack(f"{order}{2 * count}I", data[table_at:end])
    strings = []
    for i in range(count):
        length, offset = pairs[2 * i], pairs[2 * i + 1]
        if offset + length > len(data):
            raise DataFormatError(
                f"{file}: string {i} ({length} bytes at offset {offset}) runs past the end of "
                f"the file ({len(data)} bytes)"
            )
        strings.append(data[offset : offset + length])
    return strings


def _entry(original: str, translation: str) -> MoEntry:
    context = None
    if CONTEXT_SEPARATOR in original:
        context, original = original.split(CONTEXT_SEPARATOR, 1)
    msgid, _, msgid_plural = original.partition(PLURAL_SEPARATOR)
    forms = tuple(translation.split(PLURAL_SEPARATOR))
    plural = msgid_plural if PLURAL_SEPARATOR in original else None
    return MoEntry(msgid, forms[0], context, plural, forms)


def _metadata(header: str) -> dict[str, str]:
    """The header's ``Key: value`` lines, keys lower-cased."""
    fields = {}
    for line in header.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def _charset(content_type: str) -> str:
    """The charset of a ``Content-Type`` value (UTF-8 when none, or an unknown one, is named)."""
    for part in content_type.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value.strip():
            try:
                return codecs.lookup(value.strip()).name
            except LookupError:
                return "utf-8"
    return "utf-8"
