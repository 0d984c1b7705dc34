"""The fields of task mlm (its masking) and of the text tasks (``data.glue``,
``model.init_from``, ``model.init_from_hf``) are refused, naming the tasks that read them,
when a config of another task sets them: through the Python API and through ``kattn train
--set``."""

from __future__ import annotations

import pytest

from kattn.cli import main
from kattn.train import apply_overrides, preset
from kattn.train.validation import validate

MASKING = ("data.mask_prob=0.2", "data.mask_token_share=0.5", "data.random_token_share=0.2",
           "data.whole_word_mask=true")  # fmt: skip
OTHER_TASKS = ("listops", "lm", "translation", "image-classification")


@pytest.mark.parametrize("task", OTHER_TASKS)
@pytest.mark.parametrize("setting", MASKING)
def test_masking_fields_outside_mlm_are_refused(task: str, setting: str) -> None:
    key = setting.partition("=")[0]
    config = apply_overrides(preset("small", task), [setting])
    with pytest.raises(ValueError, match=rf"^{key} is for task mlm, not {task}$"):
        validate(config)


@pytest.mark.parametrize("task", (*OTHER_TASKS, "mlm"))
def test_glue_outside_the_text_tasks_is_refused(task: str) -> None:
    config = apply_overrides(preset("small", task), ['data.glue="rte"'])
    message = rf"^data\.glue is for tasks text-classification and finetune, not {task}$"
    with pytest.raises(ValueError, match=message):
        validate(config)


@pytest.mark.parametrize("task", (*OTHER_TASKS, "mlm", "text-classification"))
@pytest.mark.parametrize("key", ["init_from", "init_from_hf"])
def test_starts_outside_finetune_are_refused(task: str, key: str) -> None:
    config = apply_overrides(preset("small", task), [f'model.{key}="runs/start"'])
    with pytest.raises(ValueError, match=rf"^model\.{key} is for task finetune, not {task}$"):
        validate(config)


def test_the_owning_tasks_keep_their_fields() -> None:
    validate(apply_overrides(preset("small", "mlm"), list(MASKING)))
    config = validate(apply_overrides(preset("small", "text-classification"), ['data.glue="rte"']))
    assert config.data.glue == "rte"


def test_set_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--task", "lm", "--set", "data.mask_prob=0.3", "--print-config"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data.mask_prob is for task mlm, not lm" in err and "Traceback" not in err


def test_embedding_norm_reaches_the_encoders_that_read_it():
    """``model.embedding_norm`` builds the LayerNorm in the models of the tasks that read it
    (an LRA classifier, the causal and the masked LM) and is refused where nothing reads it."""
    from kattn.train.mlm import build_masked_lm
    from kattn.train.tasks import build_lm

    config = apply_overrides(preset("small", "lm"), ["model.embedding_norm=true"])
    assert build_lm(config, 50).encoder.embedding_norm is not None
    config = apply_overrides(preset("small", "mlm"), ["model.embedding_norm=true"])
    assert build_masked_lm(config, 60).encoder.embedding_norm is not None
    config = apply_overrides(preset("small", "translation"), ["model.embedding_norm=true"])
    with pytest.raises(ValueError, match=r"model\.embedding_norm is for tasks listops"):
        validate(config)
