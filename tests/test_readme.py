"""The README's Python example runs as written."""

import re
import warnings
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the dropout notice of patch()
        for block in blocks:
            exec(compile(block, str(README), "exec"), {})
