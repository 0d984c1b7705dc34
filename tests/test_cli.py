import json
import subprocess
import sys

import kattn
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
