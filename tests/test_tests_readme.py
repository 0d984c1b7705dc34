"""tests/README.md describes every test folder (a row of its layout table) and names every
file at the root of tests/, so that a new suite is found where the page says."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
README = (TESTS / "README.md").read_text()


def test_every_test_folder_has_a_row() -> None:
    folders = sorted(p.name for p in TESTS.iterdir() if (p / "__init__.py").is_file())
    rows = set(re.findall(r"^\| `([\w-]+)/` \|", README, flags=re.M))
    assert folders and not set(folders) - rows, sorted(set(folders) - rows)


def test_every_root_file_is_named() -> None:
    files = sorted(p.name for p in TESTS.glob("*.py") if p.name != "__init__.py")
    missing = [name for name in files if f"`{name}`" not in README]
    assert "test_contract.py" in files and not missing, missing


def test_the_files_it_names_in_folders_exist() -> None:
    """A path the page names is a file of tests/ or, like ``benchmarks/gpu_check.py``, of
    the repository."""
    named = re.findall(r"`([\w-]+/\w+\.py)`", README)
    missing = [n for n in named if not (TESTS / n).is_file() and not (TESTS.parent / n).is_file()]
    assert named and not missing, missing
