"""``kattn pattern``: the summary counts the keys of the pattern, PNGs are written, options go
to the mechanisms that have them, and what cannot be drawn is refused with a clear error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kattn.bench.patterns import mechanism_pattern, pattern_mechanisms, write_patterns
from kattn.cli import main
from kattn.registry import MECHANISMS


def test_sparse_mechanisms_have_patterns_and_dense_ones_do_not():
    names = pattern_mechanisms()
    assert "local" in names
    assert "softmax" not in names and "performer" not in names


def test_summary_counts_the_window(capsys):
    """A band of 9 keys over 32 positions: queries near the edges read fewer keys."""
    assert main(["pattern", "local", "--length", "32", "--option", "window=9", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    expected = [min(i + 4, 31) - max(i - 4, 0) + 1 for i in range(32)]
    assert row["max_keys"] == 9
    assert row["mean_keys"] == pytest.approx(sum(expected) / 32)
    assert row["density"] == pytest.approx(sum(expected) / 32**2)
    assert row["options"] == {"window": 9}


def test_causal_patterns_never_read_the_future():
    for name in pattern_mechanisms():
        allowed = mechanism_pattern(name, 40, causal=True, options=_small(name))
        assert not allowed.triu(1).any(), name


def test_pngs_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    names = pattern_mechanisms()
    summaries = write_patterns(names, tmp_path, length=48, options={n: _small(n) for n in names})
    for s in summaries:
        assert s.image is not None
        data = Path(s.image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pattern", "softmax"], "has no fixed attention pattern"),
        (["pattern", "local", "--option", "window"], "must be \\[NAME:\\]KEY=VALUE"),
        (["pattern", "local", "--option", "nonsense=3"], "no mechanism drawn has an option"),
        (["pattern", "local", "--option", "bigbird:block_size=3"], "which is not being drawn"),
    ],
)
def test_refusals_name_the_problem(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "kattn: error:" in err
    assert re.search(message, err), err


def _small(name: str) -> dict:
    """Options that make each pattern sparse at a few dozen tokens."""
    small = {"window": 7, "block_size": 8, "stride": 8}
    return {k: v for k, v in small.items() if k in (MECHANISMS.option_names(name) or [])}
