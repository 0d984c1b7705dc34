"""What a run writes is strict JSON (no NaN or Infinity: null instead), and a split without
examples is refused before training instead of scoring as accuracy 0."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from kattn.cli import main
from kattn.data import SequenceDataset, TaskData
from kattn.train.checkpoint import save_json
from kattn.train.loop import train
from kattn.train.metrics import METRICS, MetricsLog
from kattn.train.objectives import build_objective

from ..data.test_image import write_cifar
from .test_train_loop import listops_dir, tiny  # noqa: F401  (the fixture)


def refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def strict(text: str) -> object:
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path):
    path = tmp_path / "results.json"
    save_json(path, {"loss": math.nan, "rates": [1.5, math.inf, -math.inf], "n": 3})
    assert strict(path.read_text()) == {"loss": None, "rates": [1.5, None, None], "n": 3}
    log = MetricsLog(tmp_path, total_steps=1, progress=False, tensorboard=False)
    log.record("train", 1, {"loss": math.nan, "perplexity": math.inf, "accuracy": 0.5})
    assert strict((tmp_path / METRICS).read_text()) == {
        "step": 1, "split": "train", "loss": None, "perplexity": None, "accuracy": 0.5,
    }  # fmt: skip


def test_a_diverged_run_writes_strict_json(listops_dir, tmp_path, capsys):  # noqa: F811
    """A learning rate of 1e30 makes every loss NaN from step 2: the files stay JSON."""
    config = tiny(
        "listops", listops_dir, "optim.lr=1e30", 'optim.schedule="constant"', "train.steps=2",
        "train.eval_every=2", "train.log_every=1", "optim.grad_clip_value=null",
    )  # fmt: skip
    results = train(config, tmp_path / "run", progress=False)
    assert math.isnan(results["test_loss"])  # in memory, the number it is
    saved = strict((tmp_path / "run" / "results.json").read_text())
    assert isinstance(saved, dict) and saved["test_loss"] is None
    rows = [strict(line) for line in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert any(row["loss"] is None for row in rows)  # type: ignore[index]
    assert main(["eval", "--run", str(tmp_path / "run"), "--device", "cpu"]) == 0
    assert strict(capsys.readouterr().out)["loss"] is None  # type: ignore[index]


def test_an_empty_test_batch_exits_2_naming_the_split_and_file(tmp_path, capsys):
    folder = write_cifar(tmp_path / "data")
    with (folder / "test_batch").open("wb") as file:
        pickle.dump({b"labels": [], b"data": np.zeros((0, 3072), dtype=np.uint8)}, file)
    argv = ["train", "--task", "image", "--data", str(folder), "--out", str(tmp_path / "run")]
    quick = ["--steps", "2", "--set", "optim.warmup_steps=1", "--device", "cpu", "--no-progress"]
    assert main([*argv, *quick]) == 2
    err = capsys.readouterr().err
    assert "test split is empty" in err and str(folder / "test_batch") in err
    assert not (tmp_path / "run" / "results.json").exists()


def test_an_empty_split_of_any_task_is_refused_before_training():
    split = SequenceDataset(torch.ones(4, 3, dtype=torch.int16), torch.full((4,), 3),
                            torch.arange(4))  # fmt: skip
    empty = SequenceDataset(torch.ones(0, 3, dtype=torch.int16), torch.zeros(0, dtype=torch.int64),
                            torch.zeros(0, dtype=torch.int64))  # fmt: skip
    data = TaskData("listops", split, empty, split, 17, 10, 3, {"source": "/data/listops"})
    config = tiny("listops", Path("/data/listops"))
    with pytest.raises(ValueError, match=r"the valid split of task listops has no examples"):
        build_objective(config, data)
