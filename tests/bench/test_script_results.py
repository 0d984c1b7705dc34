"""The files and the machine line the timing scripts of ``benchmarks/`` write alike."""

import json

from kattn.bench.script_results import machine_line, write_run

INFO = {"processor": "Test CPU 9000", "torch_threads": 2, "torch": "2.9.0+cpu",
        "kattn": "0.1.0", "python": "3.12.1"}  # fmt: skip


def test_machine_line_names_processor_threads_and_versions():
    assert machine_line(INFO) == (
        "Test CPU 9000, 2 threads; torch 2.9.0+cpu, kattn 0.1.0, Python 3.12.1."
    )


def test_write_run_names_the_files_by_benchmark_machine_and_quick(tmp_path, capsys):
    report = {"machine": INFO, "seconds": {"256": 0.5}}
    full = write_run(tmp_path, "demo", report, "# full\n", quick=False)
    quick = write_run(tmp_path, "demo", report, "# quick\n", quick=True)
    assert full.name == "demo-cpu-test-cpu-9000-torch2.9.0-kattn0.1.0"
    assert quick.name == full.name + "-quick"
    # the stem ends in a version ("0.1.0"): the files are named by appending, not a suffix
    assert json.loads((tmp_path / f"{quick.name}.json").read_text()) == report
    assert (tmp_path / f"{full.name}.md").read_text() == "# full\n"
    assert (tmp_path / f"{quick.name}.md").read_text() == "# quick\n"
    assert "# quick" in capsys.readouterr().out
