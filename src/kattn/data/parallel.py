"""Parallel text of the translation task (IWSLT'14 De–En in Luo et al., 2021, §4.3): aligned
sentence pairs in train, valid and test splits.

Sources read:

* the embedded default, :func:`gettext_corpus` — the gettext catalogues installed on this
  machine (``<root>/<lang>/LC_MESSAGES/*.mo``): every English msgid with its translation,
  filtered and split; nothing is downloaded and no third-party text is shipped.
* :func:`load_iwslt` — the folder fairseq's ``prepare-iwslt14.sh`` writes: ``train.de``,
  ``train.en``, ``valid.*``, ``test.*``, tokenised, one sentence per line, aligned.
* :func:`load_parallel_files` — two files of aligned lines, split by a hash of each source
  line like the embedded corpus.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import DataFormatError
from .gettext_catalog import read_mo

SPLITS = ("train", "valid", "test")
#: the fractions of train, valid and test among pairs split by hash.
PARALLEL_SPLIT_FRACTIONS = (0.94, 0.03, 0.03)
#: where the gettext catalogues of a Debian/Ubuntu system live.
LOCALE_ROOT = "/usr/share/locale"

#: the placeholders a translation must keep: printf conversions (``%s``, ``%-10.3lld``,
#: ``%1$s``, Python's ``%(name)s``; ``%%`` too), ``{}``/``{0}``/``{name}`` fields, ``${var}``
#: and ``$VAR`` shell variables, and ``<tag>``/``</tag>`` markup.
PLACEHOLDER = re.compile(
    r"%(?:\d+\$|\([A-Za-z_]\w*\))?[-+#0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?"
    r"(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGaAcspnmC%]"
    r"|\{[A-Za-z_0-9.]*\}|\$\{[A-Za-z_]\w*\}|\$[A-Z_][A-Z0-9_]*|</?[A-Za-z][^<>]*>"
)
#: keyboard accelerators: ``_`` (GTK) or ``&`` (Qt/KDE) right before a letter at the start of a
#: word (not ``__x``, ``snake_case`` or an HTML entity like ``&amp;``), and ``~`` (LibreOffice).
ACCELERATOR = re.compile(r"(?<!\w)_(?=[^\W_])|&(?=[^\W_])(?!#?\w+;)|~(?=[^\W_])")


@dataclass
class ParallelCorpus:
    """Aligned sentence pairs in three splits.

    Attributes:
        src_lang, tgt_lang: the languages of the two sides (``"en"``, ``"de"``...).
        train, valid, test: ``(source, target)`` pairs of each split.
        manifest: what was read and how: files (with SHA-256), pair counts after each filter,
            the split rule and sizes — for a run's results.
    """

    src_lang: str
    tgt_lang: str
    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]
    manifest: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> list[tuple[str, str]]:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        pairs: list[tuple[str, str]] = getattr(self, name)
        return pairs

    def sizes(self) -> dict[str, int]:
        return {name: len(self.split(name)) for name in SPLITS}


def gettext_corpus(
    src: str = "en",
    tgt: str = "de",
    root: str | Path = LOCALE_ROOT,
    *,
    plurals: str = "singular",
    max_chars: int = 300,
    max_words: int = 60,
    fractions: tuple[float, float, float] = PARALLEL_SPLIT_FRACTIONS,
) -> ParallelCorpus:
    """The embedded parallel corpus: English msgids and their translations from every
    ``<root>/<lang>/LC_MESSAGES/*.mo`` (``lang`` is the side that is not ``"en"``; regional
    folders such as ``de_CH`` are not read), in sorted file order.

    Pairs go through, in order (``manifest["counts"]`` has the count after each step):

    1. ``read`` — every message (a msgctxt is dropped; the msgid stays); with
       ``plurals="singular"`` a plural entry gives (msgid, msgstr[0]); with ``"both"`` also
       (msgid_plural, msgstr[1]) — the second form is the plural of languages with two forms
       (German), only an approximation for others.
    2. ``normalised`` — accelerators removed on both sides (:data:`ACCELERATOR`: they mark a
       key, not a word) and every whitespace run made one space (pairs become single lines).
    3. ``nonempty`` — pairs with an empty side dropped.
    4. ``translated`` — pairs whose translation equals the source dropped.
    5. ``placeholders`` — pairs kept only where both sides hold the same multiset of
       placeholders (:data:`PLACEHOLDER`), which stay in the text verbatim.
    6. ``length`` — pairs kept where each side has at most ``max_chars`` characters and at
       most ``max_words`` whitespace-separated words.
    7. ``deduplicated`` — one pair per source: its most frequent translation, ties going to
       the smallest string (independent of file order).

    Splits are by hash of the English side (:func:`split_of`), so a pair keeps its split when
    catalogues are added, and ``en→de`` and ``de→en`` split alike.

    Raises:
        DataFormatError: neither side is ``"en"``, or no catalogue of the language is installed
            (the message says to give a corpus with ``--data``).
    """
    if plurals not in ("singular", "both"):
        raise ValueError(f"plurals must be 'singular' or 'both', got {plurals!r}")
    if "en" not in (src, tgt) or src == tgt:
        raise DataFormatError(
            f"the gettext corpus pairs English msgids with one translation: one side must be "
            f"'en', got {src}→{tgt}; give a parallel corpus of that pair with --data"
        )
    lang = tgt if src == "en" else src
    folder = Path(root) / lang / "LC_MESSAGES"
    files = sorted(folder.glob("*.mo")) if folder.is_dir() else []
    if not files:
        raise DataFormatError(
            f"no gettext catalogues (*.mo) for {lang!r} under {folder}: this machine has no "
            f"embedded {src}–{tgt} corpus; give one with --data (an IWSLT'14 folder with "
            f"train.{src}, train.{tgt}, valid.*, test.*, or two files of aligned lines)"
        )
    pairs: list[tuple[str, str]] = []
    listed, undecodable = [], 0
    for file in files:
        catalog = read_mo(file)
        undecodable += catalog.undecodable
        for entry in catalog.entries:
            pairs.append((entry.msgid, entry.msgstr))
            if plurals == "both" and entry.msgid_plural and len(entry.plural_forms) > 1:
                pairs.append((entry.msgid_plural, entry.plural_forms[1]))
        listed.append(
            {
                "file": file.name,
                "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
                "messages": len(catalog.entries),
            }
        )
    pairs, counts = filter_pairs(pairs, max_chars=max_chars, max_words=max_words)
    if src != "en":
        pairs = [(t, s) for s, t in pairs]
    manifest = {
        "source": "gettext",
        "root": str(Path(root)),
        "folder": str(folder),
        "files": listed,
        "undecodable": undecodable,
        "options": {"plurals": plurals, "max_chars": max_chars, "max_words": max_words},
        "counts": counts,
    }
    english = 0 if src == "en" else 1
    return _split_by_hash(src, tgt, pairs, manifest, fractions, english)


def filter_pairs(
    pairs: Iterable[tuple[str, str]], *, max_chars: int = 300, max_words: int = 60
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Steps 2–7 of :func:`gettext_corpus` on ``(source, translation)`` pairs; returns the
    kept pairs (sorted by source) and the count after each step."""
    kept = [(normalise(s), normalise(t)) for s, t in pairs]
    counts = {"read": len(kept), "normalised": len(kept)}
    kept = [(s, t) for s, t in kept if s and t]
    counts["nonempty"] = len(kept)
    kept = [(s, t) for s, t in kept if s != t]
    counts["translated"] = len(kept)
    kept = [(s, t) for s, t in kept if placeholders(s) == placeholders(t)]
    counts["placeholders"] = len(kept)
    kept = [(s, t) for s, t in kept if _short(s, max_chars, max_words)]
    kept = [(s, t) for s, t in kept if _short(t, max_chars, max_words)]
    counts["length"] = len(kept)
    choices: dict[str, Counter[str]] = defaultdict(Counter)
    for s, t in kept:
        choices[s][t] += 1
    kept = [(s, min(c, key=lambda t: (-c[t], t))) for s, c in sorted(choices.items())]
    counts["deduplicated"] = len(kept)
    return kept, counts


def normalise(text: str) -> str:
    """``text`` without keyboard accelerators (:data:`ACCELERATOR`), whitespace runs made one
    space, stripped."""
    return " ".join(ACCELERATOR.sub("", text).split())


def placeholders(text: str) -> Counter[str]:
    """The multiset of placeholders in ``text`` (:data:`PLACEHOLDER`)."""
    return Counter(PLACEHOLDER.findall(text))


def split_of(text: str, fractions: tuple[float, float, float] = PARALLEL_SPLIT_FRACTIONS) -> str:
    """``"train"``, ``"valid"`` or ``"test"`` for ``text``, from the first 8 bytes of the
    SHA-256 of its UTF-8 as a fraction of 2^64: the same text always lands in the same split,
    whatever else the corpus holds."""
    point = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64
    if point < fractions[0]:
        return "train"
    return "valid" if point < fractions[0] + fractions[1] else "test"


def load_iwslt(folder: str | Path, src: str = "de", tgt: str = "en") -> ParallelCorpus:
    """The IWSLT'14 folder fairseq prepares (``train.{src,tgt}``, ``valid.*``, ``test.*``;
    tokenised text, one sentence per line, aligned), lines stripped of their newline only.
    Pairs with an empty side are left out and counted in ``manifest["empty"]``.

    Raises:
        DataFormatError: the folder or a file is missing, a file is not UTF-8, or the two
            files of a split differ in line count; the message names the file and line.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFormatError(
            f"{root} is not a folder: expected the IWSLT'14 layout (train.{src}, train.{tgt}, "
            f"valid.{src}, valid.{tgt}, test.{src}, test.{tgt})"
        )
    splits, listed, empty = {}, [], {}
    for name in SPLITS:
        paths = (root / f"{name}.{src}", root / f"{name}.{tgt}")
        pairs, skipped, files = _aligned(*paths)
        splits[name], empty[name] = pairs, skipped
        listed += files
    manifest = {"source": "iwslt", "folder": str(root), "files": listed, "empty": empty}
    manifest["splits"] = {name: len(splits[name]) for name in SPLITS}
    return ParallelCorpus(src, tgt, splits["train"], splits["valid"], splits["test"], manifest)


def load_parallel_files(
    src_file: str | Path,
    tgt_file: str | Path,
    src: str,
    tgt: str,
    *,
    fractions: tuple[float, float, float] = PARALLEL_SPLIT_FRACTIONS,
) -> ParallelCorpus:
    """Two files of aligned lines (UTF-8, one sentence per line), split by a hash of each
    source line (:func:`split_of`); pairs with an empty side are left out and counted.

    Raises:
        DataFormatError: a file is missing or not UTF-8, or the line counts differ; the message
            names the file and line.
    """
    pairs, skipped, files = _aligned(Path(src_file), Path(tgt_file))
    manifest = {"source": "plain", "files": files, "empty": skipped}
    return _split_by_hash(src, tgt, pairs, manifest, fractions, 0)


# ------------------------------------------------------------------------------------ helpers
def _short(text: str, max_chars: int, max_words: int) -> bool:
    return len(text) <= max_chars and len(text.split()) <= max_words


def _split_by_hash(
    src: str,
    tgt: str,
    pairs: list[tuple[str, str]],
    manifest: dict[str, Any],
    fractions: tuple[float, float, float],
    key_side: int,
) -> ParallelCorpus:
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be 3 non-negative numbers summing to 1: {fractions}")
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for pair in pairs:
        splits[split_of(pair[key_side], fractions)].append(pair)
    manifest = {
        **manifest,
        "split": {
            "rule": "sha256 of the UTF-8 of the "
            + ("English side" if manifest.get("source") == "gettext" else "source line")
            + ", first 8 bytes as a fraction of 2^64",
            "fractions": list(fractions),
        },
        "splits": {name: len(splits[name]) for name in SPLITS},
    }
    return ParallelCorpus(src, tgt, splits["train"], splits["valid"], splits["test"], manifest)


def _aligned(
    src_path: Path, tgt_path: Path
) -> tuple[list[tuple[str, str]], int, list[dict[str, Any]]]:
    """The aligned non-empty line pairs of two files, the count of pairs with an empty side,
    and the files' entries for a manifest."""
    sides = [_lines(src_path), _lines(tgt_path)]
    if len(sides[0]) != len(sides[1]):
        short, long_ = (0, 1) if len(sides[0]) < len(sides[1]) else (1, 0)
        paths = (src_path, tgt_path)
        raise DataFormatError(
            f"{paths[short]} ends after line {len(sides[short])} but {paths[long_]} has "
            f"{len(sides[long_])} lines (line {len(sides[short]) + 1} has no partner): the two "
            f"files must hold aligned lines"
        )
    pairs = [(s, t) for s, t in zip(*sides, strict=True) if s.strip() and t.strip()]
    files = [
        {"file": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "lines": len(s)}
        for p, s in zip((src_path, tgt_path), sides, strict=True)
    ]
    return pairs, len(sides[0]) - len(pairs), files


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataFormatError(f"{path} is missing: expected UTF-8 text, one sentence per line")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataFormatError(f"{path}, line {line}: not valid UTF-8 ({err.reason})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]
