"""Adding a mechanism is one module: a file in ``kattn/attention/`` with one registration, and
``kattn list``, the contract tests, ``kattn bench speed``, ``kattn bench approx --experiment
mechanisms`` and ``kattn report`` all take it up with nothing else edited.

The test copies kattn's source to a temporary folder, adds one module there (a toy mechanism:
softmax attention at temperature 2) and runs each of those in a fresh process on the copy.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kattn

SOURCE = Path(kattn.__file__).resolve().parent
ROOT = SOURCE.parents[1]
NAME = "toy_tempered"
TOY_MODULE = '''
"""Softmax attention at temperature 2: ``softmax(q·k / (2√D)) v`` (a toy for the tests)."""

from ..functional.softmax import softmax_attention, softmax_attention_reference
from ..registry import register_mechanism
from .base import Attention


class TemperedAttention(Attention):
    def __init__(self, *, head_dim, num_heads, max_len=None, temperature: float = 2.0):
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        self.scale = 1.0 / (temperature * head_dim**0.5)

    def _attend(self, q, k, v, *, causal, key_padding_mask):
        return softmax_attention(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=self.scale
        )

    def _reference(self, q, k, v, *, causal, key_padding_mask):
        return softmax_attention_reference(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=self.scale
        )


register_mechanism(
    "toy_tempered",
    TemperedAttention,
    summary="Softmax attention at temperature 2.",
    reference="A toy for the tests",
    complexity="O(L²·D)",
    approximates="softmax",
)
'''


@pytest.fixture(scope="module")
def source_with_toy(tmp_path_factory):
    """A copy of kattn's source with one more module in ``attention/``."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(SOURCE, src / "kattn", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "kattn" / "attention" / "toy_tempered.py").write_text(textwrap.dedent(TOY_MODULE))
    return src


def run(src: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_copy_is_what_runs(source_with_toy):
    out = run(source_with_toy, "-c", "import kattn; print(kattn.__file__)").stdout
    assert out.strip() == str(source_with_toy / "kattn" / "__init__.py")


def test_kattn_list_shows_it(source_with_toy):
    out = run(source_with_toy, "-m", "kattn", "list", "--markdown").stdout
    row = next(line for line in out.splitlines() if line.startswith(f"| {NAME} |"))
    assert "Softmax attention at temperature 2." in row and "A toy for the tests" in row


def test_the_contract_tests_run_on_it(source_with_toy):
    out = run(source_with_toy, "-m", "pytest", "tests/test_contract.py", "-k", NAME,
              "-o", "addopts=", "-q", "-p", "no:cacheprovider").stdout  # fmt: skip
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 15, summary


def test_bench_speed_approx_and_report_take_it_up(source_with_toy, tmp_path):
    speed, approx = tmp_path / "speed", tmp_path / "approx"
    quick = ("--lengths", "64,128", "--repeats", "1", "--seconds", "0.01")
    run(source_with_toy, "-m", "kattn", "bench", "speed", "--mechanisms", NAME, *quick,
        "--out", str(speed))  # fmt: skip
    rows = json.loads(next(speed.glob("*.json")).read_text())["rows"]
    assert {r["mechanism"] for r in rows} >= {NAME}
    assert all(r["status"] == "ok" for r in rows if r["mechanism"] == NAME)

    run(source_with_toy, "-m", "kattn", "bench", "approx", "--experiment", "mechanisms",
        "--mechanisms", NAME, "--lengths", "64", "--seeds", "1", "--heads", "1",
        "--out", str(approx))  # fmt: skip
    rows = json.loads(next(approx.rglob("*.json")).read_text())["rows"]
    toy = [r for r in rows if r["mechanism"] == NAME]
    assert toy and all(r["reference"] == "softmax" and r["counterpart"] for r in toy)
    assert all(0 < r["rel_error"] < 1 for r in toy)  # temperature 2: not softmax, but close

    report = tmp_path / "report.md"
    run(source_with_toy, "-m", "kattn", "report", str(speed), str(approx), "--out", str(report))
    assert report.read_text().count(NAME) >= 2
