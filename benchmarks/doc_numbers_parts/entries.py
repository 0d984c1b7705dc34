"""What a page says, as the check sees it: a quoted sentence (``Quote``), a generated table
(``Block``), or a listed passage (``Unrecorded``, ``NotMeasured``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .sources import load


def loose(text: str) -> str:
    """A regex for ``text`` in which any run of whitespace matches any run of whitespace."""
    return r"\s+".join(re.escape(part) for part in text.split())


@dataclass(frozen=True)
class Quote:
    """A sentence of ``page`` with the numbers ``values(*files)`` in its format fields."""

    page: str
    sources: tuple[str, ...]
    template: str
    values: Callable[..., Sequence[Any]]

    def expected(self) -> str:
        return self.template.format(*self.values(*(load(s) for s in self.sources)))


@dataclass(frozen=True)
class Block:
    """A generated part of ``page``: ``render(*files)`` between the markers named ``name``."""

    page: str
    name: str
    sources: tuple[str, ...]
    render: Callable[..., str]

    def marker(self) -> str:
        return (
            f"<!-- generated from {', '.join(self.sources)} by benchmarks/doc_numbers.py "
            f"({self.name}): do not edit -->"
        )

    def expected(self) -> str:
        return self.render(*(load(s) for s in self.sources)).strip("\n")


@dataclass(frozen=True)
class Passage:
    """A passage of ``page`` (whitespace-insensitive); with ``table``, the passage opens a markdown
    table and the entry covers the whole table."""

    page: str
    passage: str
    table: bool

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the passage is (every occurrence), empty if nowhere."""
        return [self._extent(text, m) for m in re.finditer(loose(self.passage), text)]

    def _extent(self, text: str, match: re.Match[str]) -> tuple[int, int]:
        if not self.table:
            return match.span()
        end = match.end()
        while True:  # to the end of the line, then of every following table row
            newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline
            if not text.startswith("\n|", end):
                return match.start(), end
            end += 1


@dataclass(frozen=True)
class Unrecorded(Passage):
    """Measurements with no committed result file yet: committing ``missing`` would let a
    quote or a block replace the entry."""

    missing: str


@dataclass(frozen=True)
class NotMeasured(Passage):
    """Numbers that are not measurements: settings, counts, sizes of data, targets."""

    reason: str
