"""``benchmarks/gpu_check.py`` without a GPU: it refuses to run and says why, and its dry run
(kernels in Triton's interpreter, the benchmark commands asked for ``--help``) goes through
every part and writes its report."""

from __future__ import annotations

import json

import pytest
import torch

from .test_benchmark_scripts import import_benchmark

pytest.importorskip("triton", reason="the dry run runs the Triton kernels in the interpreter")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so_and_fails(capsys) -> None:
    assert import_benchmark("gpu_check").main([]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run is for machines without CUDA")
def test_the_dry_run_goes_through_every_part(tmp_path) -> None:
    gpu_check = import_benchmark("gpu_check")
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("gpu-check-cpu-*-dry-run.json")
    report = json.loads(js.read_text())
    names = {r["name"] for r in report["kernels"]}
    assert {"kattn triton", "sdpa", "kattn triton decay rpe (R=3)"} <= names
    assert all(r["finite"] and r["seconds"] > 0 for r in report["kernels"])
    # every kattn row, the relative-position kernels included, is checked against its path
    # (bf16 outputs against the fp32 PyTorch path, within the script's TOLERANCE)
    checked = {r["name"] for r in report["kernels"] if "max_abs_error" in r}
    assert names - {"sdpa"} <= checked
    assert all(r["within_tolerance"] for r in report["kernels"] if r["name"] in checked)
    steps = {c["name"]: c["returncode"] for c in report["commands"]}
    assert steps == {
        "tests: tests/ops": 0,
        "tests: tests/test_contract.py": 0,
        "tests: tests/test_device_placement.py": 0,
        "kattn bench speed": 0,
        "lm_speed": 0,
    }
    # the benchmark commands were really run (asked for help) and take --device
    lm = next(c for c in report["commands"] if c["name"] == "lm_speed")
    assert "--device" in lm["tail"]
    assert "| 48 | kattn triton |" in js.with_suffix(".md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run is for machines without CUDA")
def test_a_row_that_raises_is_recorded_counted_as_a_failure_and_the_results_written(
    tmp_path, monkeypatch
) -> None:
    import kattn.ops.triton.toeplitz_blocked as toeplitz

    def too_big(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory, required: 234248")

    monkeypatch.setattr(toeplitz, "toeplitz_linear_attention_triton", too_big)
    gpu_check = import_benchmark("gpu_check")
    args = ["--dry-run", "--skip-tests", "--skip-benchmarks", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 1
    (js,) = tmp_path.glob("gpu-check-cpu-*-dry-run.json")
    rows = json.loads(js.read_text())["kernels"]
    (bad,) = [r for r in rows if "error" in r]
    assert bad["name"] == "kattn triton toeplitz rpe (exact)"
    assert "shared memory" in bad["error"]
    assert "ERROR" in js.with_suffix(".md").read_text()
