"""``kattn bench ...`` and ``kattn demo`` refuse bad arguments before any work runs: exit
code 2 and one line naming the argument and what was expected."""

from __future__ import annotations

import argparse

import pytest

import kattn.bench.experiments as experiments
import kattn.bench.speed_report as speed_report
import kattn.cli.demo as cli_demo
from kattn.cli import build_parser, main


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Every study fails the test if it is started."""

    def started(*args, **kwargs):
        raise AssertionError("the benchmark ran before its arguments were checked")

    monkeypatch.setattr(speed_report, "measure_speed", started)
    for study in ("norm_sweep", "spectral_study", "kernel_study", "mechanism_study",
                  "stability_study"):  # fmt: skip
        monkeypatch.setattr(experiments, study, started)
    monkeypatch.setattr(cli_demo, "run_demo", started)


def refused(argv, capsys):
    """The last line written to stderr by ``kattn argv`` (which must exit with code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def commands_with(option):
    """``[command, subcommand]`` of every bench command and of demo that takes ``option``."""
    top = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    bench = next(
        a for a in top["bench"]._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    found = [["bench", name] for name, p in bench.items() if option in p._option_string_actions]
    return found + ([["demo"]] if option in top["demo"]._option_string_actions else [])


def test_every_command_with_a_device_refuses_an_unknown_one(capsys):
    chosen = commands_with("--device")
    assert ["bench", "speed"] in chosen
    for command in chosen:
        line = refused([*command, "--device", "tpu"], capsys)
        assert "--device" in line and "cpu, cuda or cuda:N" in line and "'tpu'" in line


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--repeats", "0", "an integer >= 1"),
        ("--repeats", "-3", "an integer >= 1"),
        ("--repeats", "two", "an integer >= 1"),
        ("--seconds", "0", "a finite number > 0"),
        ("--seconds", "-1", "a finite number > 0"),
        ("--seconds", "nan", "a finite number > 0"),
        ("--seconds", "inf", "a finite number > 0"),
        ("--max-call-seconds", "0", "a finite number > 0"),
        ("--memory-limit-gb", "0", "a finite number > 0"),
        ("--memory-limit-gb", "-1", "a finite number > 0"),
        ("--lengths", "", "a comma-separated list"),
        ("--lengths", ",", "a comma-separated list"),
        ("--lengths", "256,x", "integers >= 2"),
        ("--lengths", "1,256", "integers >= 2"),
        ("--mechanisms", "", "a comma-separated list"),
        ("--mechanisms", " , ", "a comma-separated list"),
        ("--batch", "0", "an integer >= 1"),
        ("--heads", "0", "an integer >= 1"),
        ("--head-dim", "0", "an integer >= 1"),
        ("--features", "0", "an integer >= 1"),
        ("--check-max-length", "-1", "an integer >= 0"),
    ],
)
def test_speed_refuses(option, value, expected, capsys):
    line = refused(["bench", "speed", "--quick", option, value], capsys)
    assert f"argument {option}" in line and expected in line and repr(value) in line


@pytest.mark.parametrize(
    "argv, option, expected",
    [
        (["--experiment", "norm-sweep", "--features", ""], "--features", "a comma-separated"),
        (["--experiment", "norm-sweep", "--features", "0,4"], "--features", "integers >= 1"),
        (["--experiment", "norm-sweep", "--radii", ""], "--radii", "a comma-separated"),
        (["--experiment", "norm-sweep", "--radii", "1,nan"], "--radii", "finite numbers > 0"),
        (["--experiment", "norm-sweep", "--variants", ""], "--variants", "a comma-separated"),
        (["--experiment", "norm-sweep", "--seeds", "0"], "--seeds", "an integer >= 1"),
        (["--experiment", "norm-sweep", "--keys", "0"], "--keys", "an integer >= 1"),
        (["--experiment", "norm-sweep", "--dim", "0"], "--dim", "an integer >= 1"),
        (["--experiment", "mechanisms", "--lengths", ""], "--lengths", "a comma-separated"),
        (["--experiment", "mechanisms", "--mechanisms", ""], "--mechanisms", "a comma-separated"),
        (["--experiment", "spectral", "--heads", "0"], "--heads", "an integer >= 1"),
        (["--experiment", "spectral", "--input-std", "-1"], "--input-std", "a finite number"),
    ],
)
def test_approx_refuses(argv, option, expected, capsys):
    line = refused(["bench", "approx", "--quick", *argv], capsys)
    assert f"argument {option}" in line and expected in line


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--mechanisms", "", "a comma-separated list"),
        ("--steps", "0", "an integer >= 1"),
        ("--seeds", "0", "an integer >= 1"),
        ("--batch", "0", "an integer >= 1"),
        ("--length", "0", "an integer >= 1"),
        ("--lr", "nan", "a finite number > 0"),
    ],
)
def test_stability_refuses(option, value, expected, capsys):
    line = refused(["bench", "stability", "--quick", option, value], capsys)
    assert f"argument {option}" in line and expected in line


@pytest.mark.parametrize(
    "option, value, expected",
    [("--train", "", "a comma-separated list"), ("--threads", "-1", "an integer >= 0")],
)
def test_demo_refuses(option, value, expected, capsys):
    line = refused(["demo", "--quick", option, value], capsys)
    assert f"argument {option}" in line and expected in line


OUTPUT_COMMANDS = [["bench", "speed", "--quick"], ["bench", "approx", "--quick"],
                   ["bench", "stability", "--quick"], ["demo", "--quick"]]  # fmt: skip


@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_an_existing_file_as_output_folder_is_refused_before_the_run(command, tmp_path, capsys):
    existing = tmp_path / "results.txt"
    existing.write_text("not a folder")
    line = refused([*command, "--out", str(existing)], capsys)
    assert "argument --out" in line and "a folder" in line and str(existing) in line
    inside = existing / "speed"  # a folder below a file cannot be made either
    line = refused([*command, "--out", str(inside)], capsys)
    assert "argument --out" in line and str(existing) in line
