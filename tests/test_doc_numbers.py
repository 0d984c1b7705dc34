"""The measured numbers of README.md and docs/ agree with the committed result files they cite
(``benchmarks/doc_numbers.py``), and the check catches a number that does not."""

import subprocess
from pathlib import Path

import pytest

from .test_benchmark_scripts import import_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _load_tool():
    """``benchmarks/doc_numbers.py`` imported as its command runs it, with ``benchmarks/`` on the
    path, where its parts (``doc_numbers_parts/``) are."""
    return import_benchmark("doc_numbers")


dn = _load_tool()


def problems_of(page: str, text: str) -> list[str]:
    return [str(p) for p in dn.check_page(page, text)[0]]


def test_every_quoted_measurement_matches_its_result_file():
    problems = dn.check()
    assert not problems, "\n".join(map(str, problems))


def test_every_page_is_checked_or_named_as_not_yet():
    pages = {"README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))}
    assert set(dn.PAGES) | set(dn.NOT_YET_CHECKED) == pages
    assert not set(dn.PAGES) & set(dn.NOT_YET_CHECKED)


def test_every_source_is_a_committed_file():
    sources = {s for entry in [*dn.QUOTES, *dn.BLOCKS] for s in entry.sources}
    tracked = subprocess.run(
        ["git", "ls-files", "--", *sorted(sources)], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert set(tracked.stdout.split()) == sources


def test_a_changed_quoted_number_is_caught_and_written_back():
    text = (ROOT / "README.md").read_text()
    wrong = text.replace("(278 µs at position 128", "(232 µs at position 128")
    assert wrong != text
    found = problems_of("README.md", wrong)
    assert any("278 µs at position 128" in p and "232 µs" in p for p in found), found
    assert dn.rewrite_page("README.md", wrong) == text


def test_a_changed_generated_table_is_caught_and_rendered_again():
    text = (ROOT / "docs" / "rpe.md").read_text()
    wrong = text.replace("| `decay` | 278 µs |", "| `decay` | 232 µs |")
    assert wrong != text
    assert any("block 'rpe-decode' differs" in p for p in problems_of("docs/rpe.md", wrong))
    assert dn.rewrite_page("docs/rpe.md", wrong) == text


def test_a_number_without_a_source_is_caught():
    text = (ROOT / "docs" / "performance.md").read_text()
    added = text + "\nThe causal form now runs 12.5× faster on a laptop.\n"
    found = problems_of("docs/performance.md", added)
    assert any("'12.5×' has no source" in p for p in found), found
    assert not problems_of("docs/performance.md", text)


def test_a_quote_needs_its_result_file_cited_on_the_page():
    text = (ROOT / "docs" / "performance.md").read_text()
    uncited = text.replace("`benchmarks/results/nystrom-cpu-*.md`", "the results")
    assert uncited != text
    found = problems_of("docs/performance.md", uncited)
    assert any("does not cite it" in p and "nystrom" in p for p in found), found


def test_numbers_in_code_are_not_taken_for_measurements():
    text = "Run it:\n\n```bash\nkattn train --lr 0.5\n```\n\nwith `dropout=0.1`.\n"
    assert [m[0] for m in dn.MEASURED.finditer(text)] == ["0.5", "0.1"]
    spans = dn.check_page("docs/api.md", text)[1]
    assert all(any(a <= m.start() < b for a, b in spans) for m in dn.MEASURED.finditer(text))


def test_unrecorded_passages_say_what_to_commit():
    for entry in dn.UNRECORDED:
        assert entry.page in dn.PAGES
        assert "benchmarks/results/" in entry.missing or "script" in entry.missing
