"""A strict reader of pipe tables (GitHub-flavoured markdown) for the table-writer tests."""

from __future__ import annotations

import re

_DELIMITER = re.compile(r":?-{3,}:?")


def cells(line: str) -> list[str]:
    """The cells of one table line, split on unescaped pipes, outer pipes removed."""
    text = line.strip()
    assert text.startswith("|") and text.endswith("|"), f"not a table line: {line!r}"
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", text[1:-1])]


def tables(markdown: str) -> list[tuple[int, list[str]]]:
    """``(first line number, lines)`` of every block of consecutive lines starting with '|'."""
    found: list[tuple[int, list[str]]] = []
    block: list[str] = []
    for number, line in enumerate([*markdown.splitlines(), ""], start=1):
        if line.lstrip().startswith("|"):
            block.append(line)
        elif block:
            found.append((number - len(block), block))
            block = []
    return found


def check_tables(markdown: str, where: str = "") -> int:
    """Assert that every table renders: a header, a delimiter row of dashes with as many cells
    as the header, and rows with as many cells again. Returns the number of tables."""
    found = tables(markdown)
    for start, lines in found:
        at = f"{where}:{start}"
        assert len(lines) >= 2, f"{at}: a header without a delimiter row"
        header, delimiter = cells(lines[0]), cells(lines[1])
        assert all(_DELIMITER.fullmatch(c) for c in delimiter), f"{at}: bad delimiter row"
        assert len(delimiter) == len(header), (
            f"{at}: {len(header)} header cells, {len(delimiter)} delimiter cells"
        )
        for offset, line in enumerate(lines[2:], start=2):
            assert len(cells(line)) == len(header), (
                f"{where}:{start + offset}: {len(cells(line))} cells, header has {len(header)}"
            )
    return len(found)
