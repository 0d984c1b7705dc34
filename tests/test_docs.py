"""The python examples of the docs pages run as written."""

import re
from pathlib import Path

import pytest

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
