"""The README's mechanism table is the registry's (``kattn list --markdown``)."""

import importlib.util
from pathlib import Path

import pytest

from kattn.catalogue import mechanism_table_markdown

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks/readme_table.py")
readme_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_table)


def test_the_readme_table_is_kattn_list_markdown():
    table = readme_table.readme_table((ROOT / "README.md").read_text(encoding="utf-8"))
    assert table == mechanism_table_markdown(), (
        "README.md's mechanism table differs from the registry: run "
        "python benchmarks/readme_table.py --write"
    )


def test_a_stale_table_is_found_and_rewritten():
    stale = f"intro\n{readme_table.BEGIN}\n| mechanism | old |\n{readme_table.END}\noutro\n"
    with pytest.raises(ValueError, match="no block"):
        readme_table.readme_table("no markers here")
    fresh = readme_table.rewrite(stale)
    assert readme_table.readme_table(fresh) == mechanism_table_markdown()
    assert fresh.startswith("intro\n") and fresh.endswith("\noutro\n")
