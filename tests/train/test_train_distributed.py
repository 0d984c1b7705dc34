"""Two processes under torchrun (gloo, CPU) train as one process with the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kattn.train.config import RunConfig
from kattn.train.loop import train
from kattn.train.metrics import iter_records

from .test_train_loop import listops_dir, tiny  # noqa: F401  (the fixture)

#: failures of torchrun's own rendezvous (not of the training): retried once
LAUNCHER_ERRORS = ("DistNetworkError", "EADDRINUSE", "address already in use", "RendezvousError")


def train_in_one_and_two_processes(
    config: RunConfig, tmp_path: Path
) -> tuple[dict[str, Any], dict[str, Any], subprocess.CompletedProcess[str]]:
    """The results of ``config`` trained in one process (run folder ``tmp_path/one``) and in
    two under torchrun (``tmp_path/two``, gloo on CPU), and the finished launcher."""
    (tmp_path / "config.json").write_text(config.to_json())
    one = train(config, tmp_path / "one", progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "kattn", "train", "--config", str(tmp_path / "config.json"),
        "--out", str(tmp_path / "two"), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and any(x in done.stderr for x in LAUNCHER_ERRORS):
        # the launcher's rendezvous lost a race for its port on a busy machine: once more
        shutil.rmtree(tmp_path / "two", ignore_errors=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    return one, two, done


@pytest.mark.slow
def test_two_processes_match_one(listops_dir, tmp_path):  # noqa: F811
    config = tiny(
        "listops", listops_dir, "model.dropout=0.0", "model.attention_dropout=0.0",
        "train.log_every=1", "train.steps=6", "train.eval_every=3",
    )  # fmt: skip
    one, two, done = train_in_one_and_two_processes(config, tmp_path)
    assert json.loads(done.stdout)["steps"] == 6  # one summary: the first process's
    assert done.stderr.count("kattn train: task listops") == 1
    losses = {
        run: [(r["step"], r["loss"]) for r in iter_records(tmp_path / run) if r["split"] != "test"]
        for run in ("one", "two")
    }
    report = f"one: {losses['one']}\ntwo: {losses['two']}\n{done.stderr[-2000:]}"
    assert [s for s, _ in losses["two"]] == [s for s, _ in losses["one"]], report
    assert [v for _, v in losses["two"]] == pytest.approx(
        [v for _, v in losses["one"]], rel=1e-5
    ), report
    assert two["test_accuracy"] == one["test_accuracy"]
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
