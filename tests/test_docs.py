"""The python examples of the docs pages run as written."""

import re
from pathlib import Path

import pytest

from .markdown_tables import check_tables

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: how the papers' text files are named inside the project (seed 000 … seed 004): no reader
#: knows these, so docs, docstrings and --help cite the papers by author, year and section
INTERNAL_PAPER_NAME = re.compile(r"\bseed[ -]?00\d", re.IGNORECASE)


@pytest.mark.parametrize(
    "page",
    [
        "rpe.md",
        "nystrom.md",
        "learned-kernels.md",
        "feedforward-kernels.md",
        "simpletron.md",
        "language-modelling.md",
        "pretraining.md",
        "sparse.md",
        "baselines.md",
        "huggingface.md",
    ],
)
def test_doc_examples_run(page):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    assert blocks, f"{page} has no python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOCS / page), "exec"), namespace)


def test_papers_are_cited_by_author_not_by_internal_file_name():
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if INTERNAL_PAPER_NAME.search(line)
    ]
    assert not found, "cite the paper (see README.md#papers) instead of:\n" + "\n".join(found)


def test_the_internal_name_pattern_catches_its_spellings():
    hits = ["(seed 000 eq. 3)", "Seed 003 Appendix F", "the seed-000 LM setting", "seed002"]
    misses = ["seed 0", "--seed 42", "seeded 001", "torch.manual_seed(0)"]
    assert all(INTERNAL_PAPER_NAME.search(text) for text in hits)
    assert not any(INTERNAL_PAPER_NAME.search(text) for text in misses)


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]
)
def test_doc_tables_render(page):
    """As many cells in every row as in the header (a bare | inside code splits a cell)."""
    check_tables((DOCS.parent / page).read_text(), page)
