"""``kattn train`` and ``kattn eval`` from the command line: presets, flags, overrides, the
embedded default, stop and resume, evaluation again."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kattn.cli import main
from kattn.train.config import RunConfig
from kattn.train.distributed import Processes, resolve_device
from kattn.train.loop import train
from kattn.train.objectives import Classification
from kattn.train.tasks import EMBEDDED_LISTOPS, TASK_LENGTHS, build_model
from kattn.train.validation import validate

from ..train.test_train_loop import listops_dir, tiny  # noqa: F401  (the fixture)

SMALL = [
    "--set", "model.dim=16", "--set", "model.num_layers=1", "--set", "model.ffn_dim=32",
    "--batch-size", "8", "--eval-every", "2", "--device", "cpu", "--no-progress",
    "--set", "optim.warmup_steps=1",
]  # fmt: skip


def config_of(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["train", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_presets_flags_and_overrides(capsys):
    lra = config_of(capsys, "--task", "text", "--preset", "lra")
    assert lra["model"]["num_layers"] == 4 and lra["optim"]["schedule"] == "rsqrt"
    assert lra["data"]["max_len"] == 1000 and lra["model"]["pooling"] == "cls"
    kl = config_of(capsys, "--task", "listops", "--preset", "kl")
    assert kl["model"]["num_layers"] == 6 and kl["optim"]["lr"] == 5e-3
    sky = config_of(
        capsys, "--task", "retrieval", "--data", "somewhere", "--attention", "performer",
        "--attention-option", "num_features=128", "--set", "model.num_layers=4",
        "--steps", "7", "--seed", "3", "--set", "optim.warmup_steps=0",
    )  # fmt: skip
    assert sky["train"]["batch_size"] == 16 and sky["data"]["max_len"] == 4096  # skyformer
    assert sky["attention"]["name"] == "performer"
    assert sky["attention"]["options"] == {"num_features": 128}
    assert sky["model"]["num_layers"] == 4 and sky["train"]["steps"] == 7
    assert sky["train"]["seed"] == 3 and sky["data"]["path"] == "somewhere"
    small = config_of(capsys)  # no --data: the embedded ListOps and the small preset
    assert small["data"]["task"] == "listops" and small["data"]["path"] is None
    assert small["optim"]["lr"] == 1e-3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "model.depth=4"], "unknown config key model.depth"),
        (["--set", "model.dim=wide"], "model.dim must be int"),
        (["--preset", "kl", "--task", "pathfinder"], "no pathfinder configuration"),
        (["--resume", "--steps", "3", "--out", "x"], "drop --steps"),
        (["--attention-option", "num_features"], "KEY=VALUE"),
    ],
)
def test_bad_flags_exit_2_with_a_message(capsys, argv, message):
    assert main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "setting", ["optim.grad_clip_value=-1", "optim.grad_clip_norm=0", "model.embedding_std=-1"]
)
def test_non_positive_clipping_and_init_exit_2(capsys, setting):
    assert main(["train", "--set", setting, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"{setting.partition('=')[0]} must be positive" in err and "Traceback" not in err


def test_a_warm_up_longer_than_a_one_cycle_run_is_shortened_with_a_warning(capsys):
    with pytest.warns(UserWarning, match=r"warms up for 15 steps \(30% of the run\)"):
        assert main(["train", "--steps", "50", "--print-config"]) == 0  # the small preset: 100


def test_clipping_off_is_null(capsys):
    config = config_of(capsys, "--set", "optim.grad_clip_value=null")
    assert config["optim"]["grad_clip_value"] is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"model": {"num_layers": "two"}}', "model.num_layers must be int, got 'two'"),
        ('{"model": [2]}', "config section 'model' must be a JSON object"),
        ('{"model": {', "is not valid JSON"),
    ],
)
def test_a_bad_config_file_exits_2_naming_file_and_key(tmp_path, capsys, text, message):
    path = tmp_path / "saved.json"
    path.write_text(text)
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["eval", "resume", "generate"])
def test_a_corrupted_config_json_in_a_run_folder_is_named(tmp_path, capsys, command):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model": {"dim": 16, "num_')  # cut short
    argv = {
        "eval": ["eval", "--run", str(run)],
        "resume": ["train", "--out", str(run), "--resume"],
        "generate": ["generate", "--run", str(run), "--prompt", "a"],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run / 'config.json'} is not valid JSON" in err


@pytest.mark.parametrize("command", ["train", "train-print", "eval", "generate"])
@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0"])
def test_an_unknown_device_exits_2_listing_the_valid_ones(tmp_path, capsys, command, device):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(RunConfig().to_json())
    argv = {
        "train": ["train", "--out", str(tmp_path / "new")],
        "train-print": ["train", "--print-config"],
        "eval": ["eval", "--run", str(run)],
        "generate": ["generate", "--run", str(run), "--prompt", "a"],
    }[command]
    assert main([*argv, "--device", device]) == 2
    err = capsys.readouterr().err
    assert "--device must be auto, cpu, cuda, cuda:N" in err and repr(device) in err


def test_resolve_device_refuses_unknown_devices():
    with pytest.raises(ValueError, match=r"device must be auto, cpu, cuda, cuda:N.*'tpu'"):
        resolve_device("tpu", Processes())
    assert resolve_device("cpu", Processes()) == torch.device("cpu")


def test_stop_resume_and_eval(listops_dir, tmp_path, capsys):  # noqa: F811
    """--stop-after is a deliberate stop (exit 0, no results printed); every start prints a
    one-line header."""
    out = str(tmp_path / "run")
    argv = ["train", "--data", str(listops_dir), "--out", out, "--steps", "6", *SMALL]
    assert main([*argv, "--stop-after", "3"]) == 0
    stopped = capsys.readouterr()
    assert stopped.out == "" and "stopped at step 3" in stopped.err and "--resume" in stopped.err
    header = stopped.err.splitlines()[0]
    for part in ("task listops", f"data {listops_dir} (64 train / 16 valid / 24 test examples)",
                 "parameters", "mechanism softmax", "device cpu", "threads"):  # fmt: skip
        assert part in header, header
    assert main(argv) == 2  # the folder holds a run
    assert main(["train", "--out", out, "--resume", "--stop-after", "3"]) == 2
    assert "--stop-after (3) is not after step 3" in capsys.readouterr().err
    assert main(["train", "--out", out, "--resume", "--no-progress"]) == 0
    summary, resumed = capsys.readouterr()
    summary = json.loads(summary)
    assert summary["steps"] == 6 and summary["majority_baseline"] > 0
    assert "resuming at step 3" in resumed.splitlines()[0]
    assert main(["eval", "--run", out, "--device", "cpu"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["accuracy"] == summary["test_accuracy"]
    assert json.loads((tmp_path / "run" / "eval-test-best.json").read_text()) == again
    assert main(["eval", "--run", str(tmp_path)]) == 2


@pytest.mark.parametrize("step", ["0", "-1"])
def test_a_stop_step_that_is_not_positive_exits_2(capsys, step):
    assert main(["train", "--stop-after", step, "--print-config"]) == 2
    assert f"--stop-after must be a positive step, got {step}" in capsys.readouterr().err


def test_the_library_refuses_a_stop_step_that_is_not_positive(listops_dir, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="stop_after must be a positive step, got 0"):
        train(tiny("listops", listops_dir), tmp_path / "run", progress=False, stop_after=0)


@pytest.mark.parametrize("rank", [0, 1])
def test_only_the_first_process_prints_the_results(monkeypatch, capsys, tmp_path, rank):
    """Under torchrun every process runs the command; one summary is printed."""
    results = {"task": "listops", **{key: 1 for key in Classification.summary_keys[1:]}}
    monkeypatch.setattr("kattn.cli.train.train", lambda *args, **kwargs: results)
    monkeypatch.setattr("kattn.cli.train.processes_from_env", lambda: Processes(rank, 2))
    assert main(["train", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (json.loads(out)["steps"] == 1) if rank == 0 else out == ""


def test_embedded_default_generates_and_caches_listops(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KATTN_CACHE", str(tmp_path / "cache"))
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, "--steps", "2", *SMALL]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["task"] == "listops" and summary["steps"] == 2
    [folder] = (tmp_path / "cache").iterdir()
    assert (folder / "basic_train.tsv").read_text().count("\n") == EMBEDDED_LISTOPS["num_train"] + 1
    results = json.loads((Path(out) / "results.json").read_text())
    assert results["data"]["embedded"] == EMBEDDED_LISTOPS
    assert results["test_examples"] == EMBEDDED_LISTOPS["num_test"]


def test_the_commands_of_reproducing_lra_resolve_and_build(capsys):
    """Every ``kattn train`` line of docs/reproducing-lra.md gives a valid config whose model
    (full size, with the mechanism options of the line) builds."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "reproducing-lra.md"
    blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S)
    lines = [shlex.split(line, comments=True) for b in blocks for line in b.splitlines()]
    commands = [w[w.index("train") + 1 :] for w in lines if "kattn" in w and "train" in w]
    assert len(commands) >= 16
    for argv in commands:
        config = RunConfig.from_dict(config_of(capsys, *argv))
        validate(config)
        if "--resume" in argv:
            continue
        task = config.data.task
        data = SimpleNamespace(
            vocab_size=300,
            max_len=config.data.max_len or TASK_LENGTHS[task],
            num_classes=10,
            train=SimpleNamespace(paired=task == "retrieval"),
        )
        model = build_model(config, data)  # type: ignore[arg-type]
        assert sum(p.numel() for p in model.parameters()) > 0, argv
