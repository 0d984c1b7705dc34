"""The training loop: run files, exact resume, atomic checkpoints, accumulation, early stop,
evaluation again, every task's model path, schedules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kattn.data import generate_listops, write_listops
from kattn.train import apply_overrides, preset
from kattn.train.batches import BatchOrder
from kattn.train.checkpoint import LAST, save_checkpoint
from kattn.train.config import SCHEDULES, RunConfig
from kattn.train.loop import Interrupted, evaluate_run, train
from kattn.train.metrics import iter_records
from kattn.train.schedules import build_optimizer, schedule_factor

from ..data.test_image import write_cifar
from ..data.test_text_retrieval import write_aan, write_imdb

REQUIRED = (
    "task", "mechanism", "steps", "test_accuracy", "best_valid_accuracy", "wall_time_s",
    "steps_per_s", "peak_memory_bytes", "num_parameters", "config",
)  # fmt: skip


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("listops")
    splits = generate_listops(64, 16, 24, min_length=5, max_length=30, max_depth=3, seed=0)
    write_listops(folder, splits)
    return folder


def tiny(task: str, path: Path, *overrides: str) -> RunConfig:
    config = preset("small", task)
    config.data.path = str(path)
    config.train.device = "cpu"
    return apply_overrides(
        config,
        [
            "model.dim=16", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=32",
            "train.steps=12", "train.batch_size=8", "train.eval_every=4", "train.log_every=2",
            "optim.warmup_steps=2", *overrides,
        ],
    )  # fmt: skip


def assert_same_final_weights(first: Path, second: Path) -> None:
    """The last checkpoints of the runs in ``first`` and ``second`` hold the same model
    weights: the same keys, every tensor bit for bit."""
    a = torch.load(first / LAST, weights_only=False)["model"]
    b = torch.load(second / LAST, weights_only=False)["model"]
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def records(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "steps_per_s"} for r in iter_records(run)]


def test_run_folder_holds_config_metrics_checkpoints_and_results(listops_dir, tmp_path):
    config = tiny("listops", listops_dir, "data.max_len=32")
    results = train(config, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for name in ("config.json", "metrics.jsonl", "last.pt", "best.pt", "results.json"):
        assert (run / name).is_file(), name
    assert RunConfig.from_dict(json.loads((run / "config.json").read_text())) == config
    saved = json.loads((run / "results.json").read_text())
    assert set(REQUIRED) <= set(saved) and saved["steps"] == 12
    assert saved["test_accuracy"] == results["test_accuracy"] and saved["test_examples"] == 24
    assert 0 <= saved["majority_baseline"] <= 1 and saved["num_parameters"] > 0
    rows = list(iter_records(run))
    assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in rows if r["split"] == "valid"] == [4, 8, 12]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert rows[-1]["split"] == "test" and rows[-1]["step"] == saved["best_step"]
    with pytest.raises(FileExistsError, match="--resume"):
        train(config, run, progress=False)


@pytest.mark.parametrize(
    "mechanism, extra",
    [("softmax", []), ("performer", ["attention.options.redraw=3", "optim.accumulate=2"])],
)
def test_interrupt_and_resume_ends_with_the_same_numbers(listops_dir, tmp_path, mechanism, extra):
    """Stopped at steps 5 and 9 and resumed twice, a run ends exactly as an uninterrupted one:
    same data order, optimiser and schedule state, dropout and feature redraws."""
    config = tiny("listops", listops_dir, f"attention.name={json.dumps(mechanism)}", *extra)
    whole = train(config, tmp_path / "whole", progress=False)
    for stop in (5, 9):
        with pytest.raises(Interrupted, match="--resume"):
            if stop == 5:
                train(config, tmp_path / "parts", progress=False, stop_after=stop)
            else:
                train(config, tmp_path / "parts", resume=True, progress=False, stop_after=stop)
    parts = train(config, tmp_path / "parts", resume=True, progress=False)
    for key in ("test_accuracy", "test_loss", "best_valid_accuracy", "best_step", "steps"):
        assert parts[key] == whole[key], key
    assert records(tmp_path / "parts") == records(tmp_path / "whole")
    assert_same_final_weights(tmp_path / "whole", tmp_path / "parts")


def test_accumulation_matches_one_big_batch(listops_dir, tmp_path):
    """Two micro-batches of 4 make the same step as one batch of 8 (no dropout)."""
    plain = ["model.dropout=0.0", "model.attention_dropout=0.0", "train.steps=3"]
    one = train(tiny("listops", listops_dir, *plain), tmp_path / "one", progress=False)
    two = train(
        tiny("listops", listops_dir, *plain, "optim.accumulate=2"), tmp_path / "two",
        progress=False,
    )  # fmt: skip
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
    first = [r["loss"] for r in iter_records(tmp_path / "one") if r["split"] == "train"]
    second = [r["loss"] for r in iter_records(tmp_path / "two") if r["split"] == "train"]
    assert second == pytest.approx(first, rel=1e-5)


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})

    def broken(obj, file):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2})
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_early_stop_and_best_after(listops_dir, tmp_path):
    config = tiny(
        "listops", listops_dir, "optim.lr=1e-12", "optim.schedule=\"constant\"",
        "train.early_stop=2", "train.best_after=0.3", "train.steps=40",
    )  # fmt: skip
    results = train(config, tmp_path / "run", progress=False)
    # the first evaluation (step 4) is before 30 % of the steps: not a candidate for best
    assert results["best_step"] == 12 and results["stopped_early"]
    assert results["steps"] == 20  # steps 16 and 20 did not improve


def test_eval_again_matches_the_results(listops_dir, tmp_path):
    results = train(tiny("listops", listops_dir), tmp_path / "run", progress=False)
    again = evaluate_run(tmp_path / "run", "test", device="cpu")
    assert again["accuracy"] == results["test_accuracy"]
    assert again["loss"] == pytest.approx(results["test_loss"], rel=1e-6)
    assert again["step"] == results["best_step"] and again["examples"] == 24
    with pytest.raises(ValueError, match="split"):
        evaluate_run(tmp_path / "run", "dev")


@pytest.mark.parametrize("task", ["text", "retrieval", "image"])
def test_every_task_trains(task, tmp_path):
    writers = {"text": write_imdb, "retrieval": write_aan, "image": write_cifar}
    folder = tmp_path / "data"
    writers[task](folder)
    config = tiny(task, folder, "train.batch_size=2", "train.steps=2", "train.eval_every=2",
                  "data.max_len=64" if task != "image" else "data.pad_id_mask=false")  # fmt: skip
    results = train(config, tmp_path / "run", progress=False)
    assert results["task"] == task and math.isfinite(results["test_loss"])
    if task == "retrieval":
        assert results["config"]["data"]["max_len"] == 64


def test_a_task_without_data_names_the_flag(tmp_path):
    config = preset("small", "text")
    with pytest.raises(ValueError, match="--data"):
        train(config, tmp_path / "run", progress=False)


def test_batch_order_is_a_seeded_permutation_per_epoch():
    order = BatchOrder(10, 4, seed=3)
    first_epoch = torch.cat([order(0), order(1), order(2)[:2]])
    assert sorted(first_epoch.tolist()) == list(range(10))
    assert torch.equal(BatchOrder(10, 4, seed=3)(2), order(2))  # a function of (seed, step)
    assert not torch.equal(BatchOrder(10, 4, seed=4)(0), order(0))


def test_schedules():
    assert schedule_factor("rsqrt", 0, 4, 100) == pytest.approx(0.25 / 2)
    assert schedule_factor("rsqrt", 3, 4, 100) == pytest.approx(1 / 2)  # peak lr/√w
    assert schedule_factor("rsqrt", 15, 4, 100) == pytest.approx(1 / 4)
    assert schedule_factor("cosine", 3, 4, 104) == 1.0
    assert schedule_factor("cosine", 54, 4, 104) == pytest.approx(0.5)
    assert schedule_factor("cosine", 104, 4, 104) == pytest.approx(0.0)
    assert schedule_factor("constant", 1, 4, 10) == 0.5
    config = preset("skyformer", "listops")
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, config.optim, total_steps=10)
    lrs, betas = [], []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        betas.append(optimizer.param_groups[0]["betas"][0])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1e-4 / 25) and max(lrs) == pytest.approx(1e-4)
    assert betas[0] == pytest.approx(0.95) and min(betas) == pytest.approx(0.85)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_no_schedule_gives_a_negative_rate(schedule):
    """Stepped once per optimiser step, the schedule's last step computes the rate after the
    run: one-cycle's linear anneal extrapolated past its end went negative there."""
    optim = apply_overrides(RunConfig(), [f"optim.schedule={json.dumps(schedule)}"]).optim
    optim.warmup_steps = 3
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 2), optim, total_steps=10)
    rates = []
    for _ in range(10):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    assert min(rates) >= 0.0, rates


def test_the_logged_learning_rate_is_the_one_applied(listops_dir, tmp_path):
    config = tiny("listops", listops_dir, "train.steps=6", "train.log_every=1")
    assert config.optim.schedule == "onecycle"
    train(config, tmp_path / "run", progress=False)
    logged = [r["lr"] for r in iter_records(tmp_path / "run") if r["split"] == "train"]
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 2), config.optim, total_steps=6)
    applied = []
    for _ in range(6):
        applied.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert logged == pytest.approx(applied)
    assert logged[0] == pytest.approx(config.optim.lr / 25)  # one-cycle starts at peak / 25
    assert min(logged) > 0


def test_tensorboard_gets_the_metrics_when_installed(listops_dir, tmp_path, monkeypatch):
    scalars: list[tuple[str, float, int]] = []

    class Writer:
        def add_scalar(self, tag: str, value: float, step: int) -> None:
            scalars.append((tag, value, step))

        def close(self) -> None:
            scalars.append(("closed", 0.0, 0))

    monkeypatch.setattr("kattn.train.metrics._summary_writer", lambda folder: Writer())
    train(tiny("listops", listops_dir, "train.steps=4"), tmp_path / "run", progress=False)
    tags = {tag for tag, _, _ in scalars}
    assert {"train/loss", "train/accuracy", "valid/accuracy", "test/accuracy"} <= tags
    assert scalars[-1][0] == "closed"
