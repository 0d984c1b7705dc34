"""``pass_attention_dropout``, the one rule of MultiheadAttention, convert_attention and the
x-transformers patch: attention-weight dropout goes to a mechanism that has weights to drop,
and elsewhere a warning at the user's line says it is not applied."""

from __future__ import annotations

import warnings

import pytest

import kattn
from kattn.nn import convert_attention
from kattn.nn.multihead import pass_attention_dropout


def test_a_mechanism_with_weights_gets_the_dropout_unless_its_options_set_one() -> None:
    options: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pass_attention_dropout(options, "softmax", 0.2)
    assert options == {"dropout": 0.2}
    options = {"dropout": 0.05}
    pass_attention_dropout(options, "softmax", 0.2)
    assert options == {"dropout": 0.05}


def test_elsewhere_a_warning_at_the_callers_line_names_what_is_not_applied() -> None:
    options: dict[str, object] = {}
    with pytest.warns(UserWarning) as record:
        pass_attention_dropout(options, "performer", 0.1, what="attn_dropout", where="layer.0: ")
    assert options == {}
    assert [str(w.message) for w in record] == [
        "layer.0: mechanism 'performer' has no attention-weight matrix to drop out: "
        "attn_dropout=0.1 is not applied"
    ]
    assert [w.filename for w in record] == [__file__]


def test_no_dropout_gives_nothing_and_an_unknown_mechanism_is_refused() -> None:
    options: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pass_attention_dropout(options, "performer", 0.0)
    assert options == {}
    with pytest.raises(ValueError, match="no_such_mechanism"):
        pass_attention_dropout(options, "no_such_mechanism", 0.1)


def test_the_module_and_the_conversion_say_it_alike() -> None:
    with pytest.warns(UserWarning) as built:
        kattn.MultiheadAttention(16, 2, dropout=0.25, mechanism="performer")
    mha = kattn.MultiheadAttention(16, 2, dropout=0.25)
    assert mha.attention.dropout == 0.25
    with pytest.warns(UserWarning) as converted:
        convert_attention(mha, "performer")
    tail = "has no attention-weight matrix to drop out: "
    assert str(built[0].message) == f"mechanism 'performer' {tail}dropout=0.25 is not applied"
    assert str(converted[0].message) == (
        f"mechanism 'performer' {tail}the MultiheadAttention's dropout=0.25 is not applied"
    )
