import json
import subprocess
import sys

import pytest

import kattn
from kattn.catalogue import mechanism_rows, mechanism_table_markdown
from kattn.cli import main


def test_list_prints_every_mechanism(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in kattn.available():
        assert f"| {name} |" in out
    assert "prf" in out


def test_list_json(capsys):
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in data["mechanisms"]] == kattn.available()
    assert set(data["feature_maps"]) == set(kattn.features.available())


def test_errors_are_reported_not_raised(capsys):
    assert main(["demo", "--quick", "--train", "nope"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err


def test_console_module_runs():
    result = subprocess.run(
        [sys.executable, "-m", "kattn", "--version"], capture_output=True, text=True, check=True
    )
    assert kattn.__version__ in result.stdout


def test_list_markdown_prints_only_the_mechanism_table(capsys):
    assert main(["list", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out == mechanism_table_markdown() + "\n"
    assert out.startswith("| mechanism |")
    lines = out.splitlines()
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == kattn.available()


def test_list_prints_the_same_table_with_a_heading_and_the_feature_maps(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert mechanism_table_markdown() in out and out != mechanism_table_markdown() + "\n"
    assert "Feature maps" in out


def test_list_takes_json_or_markdown_not_both(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "--json", "--markdown"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_json_rows_and_table_rows_come_from_one_catalogue():
    rows = mechanism_rows()
    table = mechanism_table_markdown().splitlines()
    assert len(table) == 2 + len(rows)
    for row, line in zip(rows, table[2:], strict=True):
        assert line.startswith(f"| {row['name']} | {row['summary']} |")
        assert line.endswith(f"| {row['complexity']} | {row['reference']} |")
