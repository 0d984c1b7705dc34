"""Run folders damaged by a crash, a full disk or a power loss: a cut-short or foreign
checkpoint is named with what to use instead, and a half-written last line of
``metrics.jsonl`` is dropped with a warning."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from kattn.cli import main
from kattn.train.checkpoint import BEST, LAST, load_checkpoint
from kattn.train.metrics import iter_records, truncate_metrics

from .test_train_loop import listops_dir, tiny  # noqa: F401  (the fixture)


def checkpoint_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(4096)}, "step": 3}, buffer)
    return buffer.getvalue()


@pytest.fixture
def run(listops_dir: Path, tmp_path: Path) -> Path:  # noqa: F811
    """A run folder with the config of a tiny ListOps run (no training needed)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(tiny("listops", listops_dir).to_json())
    return folder


def test_resume_from_a_truncated_last_checkpoint_names_it(run, capsys):
    whole = checkpoint_bytes()
    (run / LAST).write_bytes(whole[: len(whole) // 2])
    (run / BEST).write_bytes(whole)
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / LAST} is damaged" in err and "Traceback" not in err
    assert str(run / BEST) in err and "--checkpoint best" in err  # what is left to use


@pytest.mark.parametrize("content", [b"garbage, not a checkpoint", b""])
def test_eval_of_a_garbage_best_checkpoint_points_to_last(run, capsys, content):
    (run / BEST).write_bytes(content)
    (run / LAST).write_bytes(checkpoint_bytes())
    assert main(["eval", "--run", str(run), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{run / BEST} is damaged" in err and "--checkpoint last" in err


def test_a_checkpoint_of_something_else_is_named(tmp_path):
    path = tmp_path / BEST
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match=rf"{path} is damaged .*not a kattn checkpoint"):
        load_checkpoint(path, keys=("model",))


def test_a_checkpoint_of_another_model_is_named(run, capsys):
    (run / BEST).write_bytes(checkpoint_bytes())  # a state dict of other shapes and names
    assert main(["eval", "--run", str(run), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{run / BEST} does not fit the model of {run / 'config.json'}" in err


def rows(steps: range) -> str:
    return "".join(json.dumps({"step": s, "split": "train", "loss": 1.0}) + "\n" for s in steps)


def test_a_half_written_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(rows(range(1, 4)) + '{"step": 4, "split": "tr')  # the power went off
    with pytest.warns(UserWarning, match=r"metrics\.jsonl, line 4 is cut short .*dropped"):
        truncate_metrics(path, 10)
    assert path.read_text() == rows(range(1, 4))
    path.write_text(rows(range(1, 4)) + '{"step": 4, "split": "tr')
    with pytest.warns(UserWarning, match="line 4 is cut short"):
        assert [r["step"] for r in iter_records(tmp_path)] == [1, 2, 3]


def test_a_damaged_metrics_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(rows(range(1, 3)) + "{oops\n" + rows(range(3, 5)))
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 3 is not a JSON record"):
        truncate_metrics(path, 10)
