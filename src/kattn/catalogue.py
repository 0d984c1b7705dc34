"""The catalogue of registered mechanisms: one row per mechanism, as data or as a markdown table
(what ``kattn list`` prints)."""

from __future__ import annotations

from typing import Any

from .registry import CAPABILITY_FLAGS, available, spec

#: the column title of each capability flag in the markdown table
FLAG_TITLES = {
    "supports_causal": "causal",
    "supports_padding_mask": "padding",
    "supports_cross": "cross",
    "supports_recurrent": "recurrent",
    "is_exact": "exact",
}


def mechanism_rows() -> list[dict[str, Any]]:
    """One dict per registered mechanism, in :func:`kattn.available` order: name, summary,
    reference, complexity, default options, every capability flag, and what it approximates,
    its size option and its plot colour."""
    rows = []
    for name in available():
        s = spec(name)
        rows.append(
            {
                "name": name,
                "summary": s.summary,
                "reference": s.reference,
                "complexity": s.complexity,
                "defaults": dict(s.defaults),
                **{f: getattr(s, f) for f in CAPABILITY_FLAGS},
                "approximates": s.approximates,
                "size_option": s.size_option,
                "colour": s.colour,
            }
        )
    return rows


def mechanism_table_markdown() -> str:
    """The markdown table of the registered mechanisms (``kattn list``, and the README's table):
    name, summary, a yes/- column per capability flag, complexity and paper (no trailing
    newline)."""
    titles = [FLAG_TITLES[f] for f in CAPABILITY_FLAGS]
    lines = [
        "| mechanism | what | " + " | ".join(titles) + " | complexity | paper |",
        "|---|---|" + "---|" * len(titles) + "---|---|",
    ]
    for row in mechanism_rows():
        marks = " | ".join("yes" if row[f] else "-" for f in CAPABILITY_FLAGS)
        cells = [row["name"], row["summary"], marks, row["complexity"], row["reference"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
