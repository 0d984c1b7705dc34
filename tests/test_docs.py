"""The python examples of the docs pages run as written."""

import re
from pathlib import Path

import pytest

from .markdown_tables import check_tables

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    "page",
    [
        "rpe.md",
        "nystrom.md",
        "learned-kernels.md",
        "feedforward-kernels.md",
        "simpletron.md",
        "language-modelling.md",
    ],
)
def test_doc_examples_run(page):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    assert blocks, f"{page} has no python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOCS / page), "exec"), namespace)


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]
)
def test_doc_tables_render(page):
    """As many cells in every row as in the header (a bare | inside code splits a cell)."""
    check_tables((DOCS.parent / page).read_text(), page)
