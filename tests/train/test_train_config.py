"""Run configs: presets, dotted overrides parsed to the field types, refusals, JSON round trip."""

import itertools
import json
import warnings

import pytest
import torch

from kattn.train import RunConfig, apply_overrides, preset
from kattn.train.config import load_config
from kattn.train.schedules import build_optimizer, schedule_factor
from kattn.train.validation import validate


def test_overrides_are_parsed_to_the_field_types():
    config = apply_overrides(
        RunConfig(),
        [
            "model.num_layers=4",
            "optim.lr=3e-4",
            "optim.weight_decay=1",
            "model.norm_first=false",
            "model.head_hidden=null",
            "attention.name=performer",
            "attention.options.num_features=128",
            "data.path=/tmp/some dir",
        ],
    )
    assert config.model.num_layers == 4 and config.optim.lr == 3e-4
    assert config.optim.weight_decay == 1.0 and isinstance(config.optim.weight_decay, float)
    assert config.model.norm_first is False and config.model.head_hidden is None
    assert config.attention.name == "performer"
    assert config.attention.options == {"num_features": 128}
    assert config.data.path == "/tmp/some dir"


@pytest.mark.parametrize(
    "override, match",
    [
        ("model.layers=4", r"unknown config key model\.layers; model has: "),
        ("modle.dim=4", "unknown config section 'modle'"),
        ("model.num_layers=four", r"model\.num_layers must be int"),
        ("model.norm_first=1", r"model\.norm_first must be bool"),
        ("model.dim", r"section\.field=value"),
        ("dim=4", r"section\.field"),
    ],
)
def test_bad_overrides_are_refused_with_what_is_valid(override, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(RunConfig(), [override])


def test_the_skyformer_preset_holds_the_papers_settings_per_task():
    config = preset("skyformer", "retrieval")
    assert config.data.task == "retrieval"
    assert (config.train.batch_size, config.optim.lr, config.optim.warmup_steps) == (16, 2e-4, 800)
    assert config.data.max_len == 4096
    assert (config.model.dim, config.model.num_layers, config.model.num_heads) == (64, 2, 2)
    assert config.model.pooling == "mean" and config.optim.schedule == "onecycle"
    assert preset("skyformer", "image").train.batch_size == 256
    with pytest.raises(ValueError, match="unknown preset"):
        preset("nope", "listops")
    with pytest.raises(ValueError, match="task must be one of"):
        preset("skyformer", "mnist")


def test_json_round_trip_and_unknown_keys_in_a_saved_config():
    config = apply_overrides(preset("skyformer", "text"), ["attention.options.rpe=decay"])
    again = RunConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    bad = config.to_dict()
    bad["train"]["stepz"] = 3
    with pytest.raises(ValueError, match=r"unknown config key train\.stepz"):
        RunConfig.from_dict(bad)


@pytest.mark.parametrize(
    "override, match",
    [
        ("optim.grad_clip_value=-1", r"optim\.grad_clip_value must be positive.*null"),
        ("optim.grad_clip_value=0", r"optim\.grad_clip_value must be positive.*null"),
        ("optim.grad_clip_norm=0", r"optim\.grad_clip_norm must be positive.*null"),
        ("optim.grad_clip_norm=-2.5", r"optim\.grad_clip_norm must be positive.*null"),
        ("model.embedding_std=-1", r"model\.embedding_std must be positive"),
        ("model.embedding_std=0", r"model\.embedding_std must be positive"),
        ("optim.eps=0", r"optim\.eps must be positive"),
        ("optim.weight_decay=-0.1", r"optim\.weight_decay must be ≥ 0"),
        ("optim.beta1=1", r"optim\.beta1 must be in \[0, 1\)"),
        ("model.dropout=1.5", r"model\.dropout must be in \[0, 1\)"),
    ],
)
def test_values_out_of_range_are_refused_naming_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        validate(apply_overrides(RunConfig(), [override]))


@pytest.mark.parametrize("task", ["translation", "image-classification", "lm"])
def test_label_smoothing_is_range_checked_once_for_every_task(task):
    """One check for the two tasks that read it; the others refuse it after the range."""
    with pytest.raises(ValueError, match=r"optim\.label_smoothing must be in \[0, 1\), got 1\.0"):
        validate(apply_overrides(preset("small", task), ["optim.label_smoothing=1.0"]))


def test_clipping_is_turned_off_by_null_and_off_is_not_a_number():
    config = apply_overrides(
        RunConfig(), ["optim.grad_clip_value=null", "optim.grad_clip_norm=null"]
    )
    validate(config)
    assert config.optim.grad_clip_value is None and config.optim.grad_clip_norm is None
    with pytest.raises(
        ValueError, match=r"optim\.grad_clip_value must be float or null, got 'off'"
    ):
        apply_overrides(RunConfig(), ["optim.grad_clip_value=off"])


@pytest.mark.parametrize(
    "values, match",
    [
        ({"model": {"dim": "wide"}}, r"model\.dim must be int, got 'wide'"),
        ({"optim": {"lr": [0.1]}}, r"optim\.lr must be float, got \[0\.1\]"),
        ({"model": [64, 2]}, r"config section 'model' must be a JSON object .*got a list"),
        ({"attention": {"options": [1]}}, r"attention\.options must be dict"),
        (["model"], r"a config is a JSON object .*got a list"),
    ],
)
def test_a_saved_config_of_the_wrong_types_is_refused_naming_the_key(values, match):
    with pytest.raises(ValueError, match=match):
        RunConfig.from_dict(values)


def test_a_config_file_that_is_not_json_or_of_wrong_types_names_the_file(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text('{"model": {"dim": 64,')
    with pytest.raises(ValueError, match=rf"{broken} is not valid JSON .*line 1"):
        load_config(broken)
    broken.write_text('{"train": {"steps": "many"}}')
    with pytest.raises(ValueError, match=rf"{broken}: train\.steps must be int, got 'many'"):
        load_config(broken)
    config = preset("small", "listops")
    broken.write_text(config.to_json())
    assert load_config(broken) == config


@pytest.mark.parametrize("warmup", [10, 11, 1000])
def test_a_one_cycle_warm_up_not_shorter_than_the_run_is_shortened(warmup):
    """One-cycle then warms up for 30% of the run (3 of 10 steps), says so, and anneals to
    its floor without a negative rate."""
    config = apply_overrides(RunConfig(), ["train.steps=10", f"optim.warmup_steps={warmup}"])
    assert config.optim.schedule == "onecycle"
    with pytest.warns(UserWarning, match=rf"\({warmup}\) is not shorter .* for 3 steps"):
        validate(config)
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 2), config.optim, 10)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    peak = rates.index(max(rates))
    assert 2 <= peak <= 3 and all(r > 0 for r in rates)
    assert all(a < b for a, b in itertools.pairwise(rates[: peak + 1]))
    assert all(a > b for a, b in itertools.pairwise(rates[peak:]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fine in (0, 9):
            validate(apply_overrides(RunConfig(), ["train.steps=10", f"optim.warmup_steps={fine}"]))


@pytest.mark.parametrize("schedule", ["rsqrt", "cosine", "constant"])
def test_a_linear_warm_up_longer_than_the_run_rises_for_the_whole_run(schedule):
    """As LRA's Retrieval config does (warm-up 8000, 5000 steps): allowed, with a warning;
    the rate rises at every step and stays below the warm-up peak."""
    config = apply_overrides(
        RunConfig(), [f"optim.schedule={json.dumps(schedule)}", "train.steps=6",
                      "optim.warmup_steps=8"],
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"warmup_steps \(8\) is longer .* ends at 75%"):
        validate(config)
    peak = schedule_factor(schedule, 7, 8, 6)
    rates = [schedule_factor(schedule, step, 8, 6) for step in range(6)]
    assert all(0 < a < b < peak for a, b in itertools.pairwise(rates))
