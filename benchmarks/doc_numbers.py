"""The measured numbers that README.md and docs/*.md quote, tied to the committed result files.

Every number in the documentation that reports a measurement is one of:

* in a **generated block** (``BLOCKS``, in ``doc_numbers_parts/blocks.py``): a table rendered
  from a result file by a function of ``doc_numbers_parts/tables*.py``, between
  ``<!-- generated from <file> by benchmarks/doc_numbers.py (<name>): do not edit -->`` and
  ``<!-- end generated -->``; ``--write`` renders it again;
* in a **quote** (``QUOTES``, in ``doc_numbers_parts/quotes.py``): a sentence written as a
  template with one format field per number (``"performer **{:.1f}×** faster"``) and the
  values it takes from a result file (helpers in ``doc_numbers_parts/quote_values.py``); the
  page must contain the sentence with exactly those values, as formatted (line breaks and
  spaces are free), and ``--write`` puts the file's values into the page's sentence;
* in an **unrecorded** passage (``UNRECORDED``, in ``doc_numbers_parts/passages.py``): a
  measurement whose result file is not committed yet, listed with what to commit so that a
  quote or a block can replace it (every run of this script says what is still missing);
* or it is not a measurement and listed in ``NOT_MEASURED`` (``doc_numbers_parts/passages.py``)
  with the reason (a setting, a count, a target, the size of a download).

A page must also cite every result file it quotes (its path, or the name with ``*`` for the
processor and versions). Pages listed in ``NOT_YET_CHECKED`` (below) are not checked yet; move
one to ``PAGES`` once its numbers have quotes or blocks. The result files' paths and how they
are read are in ``doc_numbers_parts/sources.py``; the kinds of entry (``Quote``, ``Block``,
``Unrecorded``, ``NotMeasured``) in ``doc_numbers_parts/entries.py``; this file checks the
pages and rewrites them.

The check also looks for numbers with a unit of time, size, ratio or share (``ms``, ``MiB``,
``×``, ``%``…) and for decimals anywhere outside code, generated blocks, quotes and those
lists, so a number added to a page without a source fails.

    python benchmarks/doc_numbers.py            # check (exit 1 and a list of what is wrong)
    python benchmarks/doc_numbers.py --write    # rewrite blocks and quoted numbers from files

``tests/test_doc_numbers.py`` runs the check. After re-running a benchmark, commit its new
result file, run ``--write`` and read the diff: the prose around a number may need to change
with it (a "faster" that became "slower").
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from doc_numbers_parts.blocks import BLOCKS
from doc_numbers_parts.entries import Block, loose
from doc_numbers_parts.passages import NOT_MEASURED, UNRECORDED
from doc_numbers_parts.quotes import QUOTES
from doc_numbers_parts.sources import ROOT, cited_as, load

#: pages whose numbers are not tied to result files yet (each to move to PAGES, with its quotes)
NOT_YET_CHECKED: tuple[str, ...] = ()
#: the pages checked: README.md and every page of docs/ but those above
PAGES = (
    "README.md",
    "docs/api.md",
    "docs/baselines.md",
    "docs/choosing-a-mechanism.md",
    "docs/feedforward-kernels.md",
    "docs/huggingface.md",
    "docs/kernelized.md",
    "docs/language-modelling.md",
    "docs/learned-kernels.md",
    "docs/nystrom.md",
    "docs/performance.md",
    "docs/pretraining.md",
    "docs/reproducing-lra.md",
    "docs/rpe.md",
    "docs/simpletron.md",
    "docs/sparse.md",
    "docs/translation.md",
    "docs/vision.md",
)


# ---------------------------------------------------------------------------------------------
# markers and numbers on a page

END = "<!-- end generated -->"
BLOCK_RE = re.compile(
    r"<!-- generated from (?P<sources>[^>]*?) by benchmarks/doc_numbers\.py \((?P<name>[\w-]+)\)"
    r": do not edit -->\n(?P<body>.*?)\n?" + re.escape(END),
    re.S,
)
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
#: a number worth a source: one with a unit of time, size, ratio or share, or a decimal
MEASURED = re.compile(
    r"(?<![\w.^/-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
    r"\s?(?:×|ms\b|µs\b|s\b|min\b|minutes\b|[KMG]i?B\b|%|GFLOP)"
    r"|(?<![\w.^/§-])(?<!Table )\d+\.\d+(?![\d.])"
)
CODE_RE = re.compile(r"```.*?```|`[^`]+`", re.S)


def _template_regex(template: str) -> str:
    """A regex for ``template`` whose groups are its format fields (whitespace-insensitive)."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal.strip():
            lead = r"\s*" if literal[0].isspace() else ""
            trail = r"\s*" if literal[-1].isspace() else ""
            parts.append(lead + loose(literal) + trail)
        elif literal:
            parts.append(r"\s+")
        if field is not None:
            parts.append(f"({NUMBER})")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# checking and writing


@dataclass
class Problem:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_page(page: str, text: str) -> tuple[list[Problem], list[tuple[int, int]]]:
    """What is wrong on ``page`` and the spans its quotes, blocks and lists account for."""
    problems: list[Problem] = []
    spans: list[tuple[int, int]] = []
    sources: set[str] = set()
    blocks = {m["name"]: m for m in BLOCK_RE.finditer(text)}
    for block in (b for b in BLOCKS if b.page == page):
        sources |= set(block.sources)
        found = blocks.pop(block.name, None)
        if found is None:
            problems.append(Problem(page, 1, f"no generated block {block.name!r}: add "
                                    f"{block.marker()} … {END} and run --write"))  # fmt: skip
            continue
        spans.append(found.span())
        if found["sources"] != ", ".join(block.sources):
            problems.append(Problem(page, _line(text, found.start()),
                                    f"block {block.name!r} names its sources wrongly"))  # fmt: skip
        if found["body"].strip("\n") != block.expected():
            problems.append(Problem(page, _line(text, found.start()),
                                    f"block {block.name!r} differs from its result file: "
                                    "run benchmarks/doc_numbers.py --write"))  # fmt: skip
    for name, found in blocks.items():
        problems.append(Problem(page, _line(text, found.start()), f"unknown block {name!r}"))
    for quote in (q for q in QUOTES if q.page == page):
        sources |= set(quote.sources)
        expected = quote.expected()
        match = re.search(loose(expected), text)
        if match:
            spans.append(match.span())
            continue
        near = re.search(_template_regex(quote.template), text)
        where = _line(text, near.start()) if near else 1
        said = f"; the page says {' '.join(near[0].split())!r}" if near else ""
        problems.append(Problem(page, where, f"expected {expected!r} (from "
                                f"{', '.join(quote.sources)}){said}"))  # fmt: skip
    for entry in (e for e in [*UNRECORDED, *NOT_MEASURED] if e.page == page):
        covered = entry.spans(text)
        if not covered:
            kind = type(entry).__name__
            problems.append(Problem(page, 1, f"{kind} passage not found: {entry.passage!r}"))
        spans += covered
    for source in sorted(sources):
        if not any(name in text for name in cited_as(source)):
            problems.append(Problem(page, 1, f"quotes {source} but does not cite it "
                                    f"(one of {', '.join(cited_as(source))})"))  # fmt: skip
    spans += [m.span() for m in CODE_RE.finditer(text)]
    for match in MEASURED.finditer(text):
        if not any(a <= match.start() < b for a, b in spans):
            problems.append(Problem(page, _line(text, match.start()),
                                    f"{match[0]!r} has no source: quote it from a result "
                                    "file, or list it in "
                                    "benchmarks/doc_numbers_parts/passages.py"))  # fmt: skip
    return problems, spans


def check(pages: Sequence[str] = PAGES) -> list[Problem]:
    problems = []
    for page in pages:
        problems += check_page(page, (ROOT / page).read_text())[0]
    return problems


def write(pages: Sequence[str] = PAGES) -> list[str]:
    """Render every block and put every quote's values into its page; the pages changed."""
    changed = []
    for page in pages:
        path = ROOT / page
        text = path.read_text()
        new = rewrite_page(page, text)
        if new != text:
            path.write_text(new)
            changed.append(page)
    return changed


def rewrite_page(page: str, text: str) -> str:
    """``text`` of ``page`` with its blocks rendered again and its quotes' numbers taken from
    their files (a quote whose words changed is left to the check to report)."""
    for block in (b for b in BLOCKS if b.page == page):

        def replace(m: re.Match[str], block: Block = block) -> str:
            if m["name"] != block.name:
                return m[0]
            return f"{block.marker()}\n{block.expected()}\n{END}"

        text = BLOCK_RE.sub(replace, text)
    for quote in (q for q in QUOTES if q.page == page):
        if re.search(loose(quote.expected()), text):
            continue
        matches = list(re.finditer(_template_regex(quote.template), text))
        if len(matches) != 1:
            continue
        values = quote.values(*(load(s) for s in quote.sources))
        specs = [s for _, f, s, _ in string.Formatter().parse(quote.template) if f is not None]
        m, pieces = matches[0], []
        last = m.start()
        for i, (value, spec) in enumerate(zip(values, specs, strict=True), start=1):
            pieces += [text[last : m.start(i)], format(value, spec or "")]
            last = m.end(i)
        text = text[: m.start()] + "".join(pieces) + text[last:]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages from the files")
    args = parser.parse_args(argv)
    if args.write:
        for page in write():
            print(f"rewrote {page}")
    missing = sorted({entry.missing for entry in UNRECORDED})
    if missing:
        print(f"note: {len(UNRECORDED)} quoted passages have no committed result file yet; "
              "commit " + "; ".join(missing), file=sys.stderr)  # fmt: skip
    problems = check()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
