"""What the token-predicting objectives share: their metrics and rates (lm, mlm,
translation), the encoder keywords of a config (classifiers, lm, mlm), and the refusal of a
data field a task does not read."""

from __future__ import annotations

import math

import pytest

from kattn.train import apply_overrides, preset
from kattn.train.field_checks import refuse_unread_data_fields
from kattn.train.mlm import build_masked_lm
from kattn.train.objective_base import token_metrics, token_rates
from kattn.train.tasks import ENCODER_KEYWORDS, build_lm, encoder_options
from kattn.train.validation import validate


def test_token_metrics_of_summed_nats_correct_and_count() -> None:
    metrics = token_metrics([20.0, 3.0, 10.0], "masked_tokens")
    assert metrics == {"loss": 2.0, "perplexity": math.exp(2.0), "accuracy": 0.3,
                       "masked_tokens": 10}  # fmt: skip
    assert token_metrics([7100.0, 0.0, 10.0], "tokens")["perplexity"] == math.inf
    assert token_metrics([0.0, 0.0, 0.0], "tokens") == {
        "loss": 0.0, "perplexity": 1.0, "accuracy": 0.0, "tokens": 0}  # fmt: skip


def test_token_rates_per_second() -> None:
    assert token_rates(10, 4.0, 2000) == {"steps_per_s": 2.5, "tokens_per_s": 500.0}
    assert token_rates(0, 0.0, 0)["tokens_per_s"] == 0.0  # no division by zero


def test_encoder_options_follow_the_config_and_build_both_language_models() -> None:
    config = apply_overrides(
        preset("small", "mlm"),
        ["model.dim=24", "model.num_layers=1", "model.num_heads=3", "model.ffn_dim=40",
         'attention.name="performer"', "attention.options={\"num_features\": 8}"],
    )  # fmt: skip
    options = encoder_options(validate(config))
    assert set(options) == {*ENCODER_KEYWORDS, "num_features"}
    assert (options["dim"], options["depth"], options["mechanism"]) == (24, 1, "performer")
    mlm = build_masked_lm(config, 50)
    assert mlm.encoder.embedding.embedding_dim == 24 and len(mlm.encoder.layers) == 1
    lm = build_lm(apply_overrides(config, ['data.task="lm"', "data.max_len=null"]), 50)
    assert lm.mechanism == "performer" and lm.encoder.embedding.embedding_dim == 24


@pytest.mark.parametrize(("key", "field"), [("dropout", "model.dropout"),
                                            ("mechanism", "attention.name")])  # fmt: skip
def test_an_option_that_would_override_a_model_field_is_refused(key: str, field: str) -> None:
    config = preset("small", "lm")
    config.attention.options = {key: 0.3}
    with pytest.raises(ValueError, match=rf"attention.options must not hold '{key}': .* {field}"):
        encoder_options(config)


def test_an_unread_data_field_is_refused_with_the_reason() -> None:
    config = preset("small", "translation")
    refuse_unread_data_fields(config, ("block_size",))  # None: nothing to refuse
    config.data.block_size = 64
    with pytest.raises(ValueError, match=r"^data\.block_size is not used by task translation$"):
        refuse_unread_data_fields(config, ("truncate", "block_size"))
    with pytest.raises(ValueError, match=r"translation: set data\.max_len$"):
        refuse_unread_data_fields(config, ("block_size",), ": set data.max_len")
