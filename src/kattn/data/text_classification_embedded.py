"""The embedded text-classification set: which program a message comes from.

Every program translated with GNU gettext installs its catalogue of messages under
``/usr/share/locale/<lang>/LC_MESSAGES/<domain>.mo``; the English originals (msgids) of a
domain are the program's own user-facing sentences — error messages, option help, prompts —
written by its developers. The task: given one such sentence, name the program. It is real
text labelled by where it really comes from, with nothing downloaded, and not trivial: most
messages are short error sentences in one shared register (``cannot open '%s'``), so a model
must pick up each program's vocabulary (``submodule``, ``relocation``, ``keyring``...).

:func:`generate_text_classes` builds it: the msgids of each domain of
:data:`EMBEDDED_TEXT_CLASSES` (gathered over every language's catalogue, since a catalogue
holds only the messages translated into its language), stripped, kept when they have
``min_chars`` to ``max_chars`` characters, a space and no backslash; a text appearing in two
domains is dropped from both, and one appearing twice in a domain is kept once, where texts
are compared ignoring case, punctuation, quotes, spacing and which format placeholder they
hold (``Removing %s`` and ``Removing '%s'`` are one text). Each class is then cut to the same
number of texts (a seeded draw: the majority baseline is ``1 / classes``) and split by a
seeded shuffle, so no text, nor a variant of it, is in two splits. The set is written once in
AG News's CSV layout (with ``classes.txt`` and a ``manifest.json`` of its parameters,
per-domain counts and the files' SHA-256) under the cache folder and read back by
:func:`~kattn.data.agnews.load_agnews`.

The set depends on the catalogues installed: the manifest's hashes identify it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from .agnews import write_agnews_csv
from .base import DataFormatError
from .cache import cache_dir, generated_folder, parameters_key
from .gettext_catalog import read_mo

#: where the gettext catalogues of a Debian/Ubuntu system live.
LOCALE_ROOT = "/usr/share/locale"

#: the parameters of the embedded set: the domains that are its classes (a ``*`` matches a
#: version: the highest present is taken), texts per class, the text filter, the share of
#: texts in test, the seed of the draws, and how few texts a domain may have to be used.
EMBEDDED_TEXT_CLASSES: dict[str, Any] = {
    "domains": ["coreutils", "dpkg", "gas", "git", "glib20", "gnupg2", "mit-krb5", "postgres-*"],
    "per_class": 1000,
    "min_chars": 10,
    "max_chars": 200,
    "test_fraction": 0.125,
    "min_domain_texts": 400,
    "min_classes": 4,
    "seed": 0,
}
#: the version of how the set is made from its parameters (2: texts compared without
#: placeholders, punctuation and quotes).
EMBEDDED_TEXT_CLASSES_VERSION = 2
#: the files of a generated set.
MANIFEST = "manifest.json"


def embedded_text_classes(root: str | Path = LOCALE_ROOT, create: bool = True) -> Path:
    """The folder of the embedded set built from the catalogues under ``root`` (generated
    there on first use, in the cache folder)."""
    files = _domain_files(Path(root), EMBEDDED_TEXT_CLASSES["domains"])
    listing = sorted((name, str(p), p.stat().st_size) for name, ps in files.items() for p in ps)
    identity = {"parameters": EMBEDDED_TEXT_CLASSES, "version": EMBEDDED_TEXT_CLASSES_VERSION,
                "catalogues": listing}  # fmt: skip
    folder = cache_dir() / f"gettext-classes-{parameters_key(identity)}"
    if not create:
        return folder

    def write(partial: Path) -> None:
        generate_text_classes(partial, root, **EMBEDDED_TEXT_CLASSES)

    return generated_folder(folder, MANIFEST, write)


def generate_text_classes(
    out: str | Path,
    root: str | Path = LOCALE_ROOT,
    *,
    domains: list[str],
    per_class: int,
    min_chars: int,
    max_chars: int,
    test_fraction: float,
    min_domain_texts: int,
    min_classes: int,
    seed: int,
) -> dict[str, Any]:
    """Write the set (see the module docstring) to folder ``out``: ``train.csv``,
    ``test.csv``, ``classes.txt`` and ``manifest.json``; return the manifest.

    Raises:
        DataFormatError: fewer than ``min_classes`` domains have ``min_domain_texts`` texts
            under ``root`` (the machine has too few catalogues: give a set with ``--data``).
    """
    texts = _domain_texts(_domain_files(Path(root), domains), min_chars, max_chars)
    counts = {name: len(found) for name, found in texts.items()}
    used = {name: found for name, found in texts.items() if len(found) >= min_domain_texts}
    if len(used) < min_classes:
        raise DataFormatError(
            f"the gettext catalogues under {root} give {len(used)} of the domains "
            f"{', '.join(domains)} with at least {min_domain_texts} distinct messages (found "
            f"{counts}); the embedded text-classification set needs {min_classes}: give a set "
            f"in AG News's layout with --data"
        )
    size = min(per_class, *(len(found) for found in used.values()))
    rng = random.Random(seed)
    splits: dict[str, list[tuple[str, int]]] = {"train": [], "test": []}
    n_test = round(size * test_fraction)
    for label, name in enumerate(sorted(used)):
        chosen = rng.sample(sorted(used[name]), size)
        splits["test"] += [(text, label) for text in chosen[:n_test]]
        splits["train"] += [(text, label) for text in chosen[n_test:]]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for split, rows in splits.items():
        rng.shuffle(rows)
        path = folder / f"{split}.csv"
        write_agnews_csv(path, [t for t, _ in rows], [label for _, label in rows])
        hashes[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "classes.txt").write_text("".join(f"{n}\n" for n in sorted(used)), "utf-8")
    manifest = {
        "source": f"msgids of the gettext catalogues under {root}",
        "version": EMBEDDED_TEXT_CLASSES_VERSION,
        "parameters": {"domains": domains, "per_class": per_class, "min_chars": min_chars,
                       "max_chars": max_chars, "test_fraction": test_fraction,
                       "min_domain_texts": min_domain_texts, "min_classes": min_classes,
                       "seed": seed},
        "classes": sorted(used),
        "texts_per_domain": counts,
        "per_class": size,
        "sizes": {split: len(rows) for split, rows in splits.items()},
        "sha256": hashes,
    }  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2), "utf-8")
    return manifest


def _domain_files(root: Path, patterns: list[str]) -> dict[str, list[Path]]:
    """The ``.mo`` files of each domain ``patterns`` names (a ``*`` pattern: the highest
    version present), by domain."""
    present: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(root.glob("*/LC_MESSAGES/*.mo")):
        present[path.stem].append(path)
    files = {}
    for pattern in patterns:
        matches = sorted(fnmatch.filter(present, pattern), key=_version_key)
        if matches:
            files[matches[-1]] = present[matches[-1]]
    return files


def _version_key(name: str) -> tuple[int, ...]:
    digits = "".join(c if c.isdigit() else " " for c in name).split()
    return tuple(int(d) for d in digits)


def _domain_texts(
    files: dict[str, list[Path]], min_chars: int, max_chars: int
) -> dict[str, set[str]]:
    """Each domain's distinct kept msgids, less those (compared by :func:`_key`) that another
    domain has too, and less a second spelling of one within a domain."""
    texts: dict[str, dict[str, str]] = {}
    for name, paths in files.items():
        found: dict[str, str] = {}
        for path in paths:
            for entry in read_mo(path).entries:
                text = entry.msgid.strip()
                if min_chars <= len(text) <= max_chars and " " in text and "\\" not in text:
                    found.setdefault(_key(text), text)
        texts[name] = found
    owners: dict[str, int] = defaultdict(int)
    for found in texts.values():
        for key in found:
            owners[key] += 1
    return {
        name: {text for key, text in found.items() if owners[key] == 1}
        for name, found in texts.items()
    }


#: a printf conversion (``%s``, ``%-10.3lu``, ``%1$s``), a brace field (``{0}``, ``{name}``) or
#: a shell-style parameter (``$1``, ``${name}``): texts are compared without them.
_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|j|z|t|L|q|I64)?[a-zA-Z%]"
    r"|\{[^{}]*\}|\$\{?\w+\}?"
)
#: everything but letters and digits.
_SEPARATORS = re.compile(r"[\W_]+")


def _key(text: str) -> str:
    """What two texts must share to count as one: the text in lower case without its
    placeholders, every run of punctuation, quotes and spaces one space, so that
    ``Removing %s``, ``Removing '%s'`` and ``removing “%d”`` are one text (none can be in two
    splits, or in two classes)."""
    folded = _PLACEHOLDER.sub(" ", text.lower())
    return " ".join(_SEPARATORS.sub(" ", folded).split())
