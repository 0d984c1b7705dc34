"""The shared argument checks: what they accept, and the message of what they refuse."""

import math

import numpy as np
import pytest

import kattn
from kattn.checks import (
    boolean,
    int_at_least,
    positive_float,
    positive_float_or_none,
    positive_int,
    positive_int_or_none,
)


@pytest.mark.parametrize("good", [1, 7, np.int64(3).item()])
def test_positive_int_returns_what_it_accepts(good):
    assert positive_int("n", good) == good and positive_int_or_none("n", good) == good


@pytest.mark.parametrize("bad", [0, -2, 1.0, True, "3", None])
def test_positive_int_refuses_with_the_argument_name(bad):
    with pytest.raises(ValueError, match=rf"^n must be a positive int, got {bad!r}$"):
        positive_int("n", bad)


def test_or_none_variants_take_none_and_say_so():
    assert positive_int_or_none("n", None) is None and positive_float_or_none("s", None) is None
    with pytest.raises(ValueError, match=r"^n must be a positive int or None, got 0$"):
        positive_int_or_none("n", 0)
    with pytest.raises(ValueError, match=r"^s must be positive or None, got -1.0$"):
        positive_float_or_none("s", -1.0)


@pytest.mark.parametrize("good", [0.5, 2, np.float32(0.25)])
def test_positive_float_returns_a_float(good):
    value = positive_float("s", good)
    assert isinstance(value, float) and value == float(good)


@pytest.mark.parametrize("bad", [0.0, -1, math.nan, True, "1.0"])
def test_positive_float_refuses(bad):
    with pytest.raises(ValueError, match=r"^s must be positive, got "):
        positive_float("s", bad)


def test_boolean_takes_only_true_and_false():
    assert boolean("flag", True) is True and boolean("flag", False) is False
    for bad in (0, 1, "yes", None):
        with pytest.raises(ValueError, match=rf"^flag must be a bool, got {type(bad).__name__}$"):
            boolean("flag", bad)


def test_int_at_least_names_the_bound():
    assert int_at_least("n", 0, 0) == 0 and int_at_least("n", 5, 2) == 5
    for bad in (1, 2.0, True, None):
        with pytest.raises(ValueError, match=rf"^n must be an int >= 2, got {bad!r}$"):
            int_at_least("n", bad, 2)


@pytest.mark.parametrize("value", [math.inf, math.nan, 0.0, -1.0, -math.inf])
def test_positive_float_options_must_be_finite(value):
    with pytest.raises(ValueError, match="positive"):
        positive_float_or_none("scale", value)
    with pytest.raises(ValueError, match="positive"):
        kattn.build("softmax", head_dim=8, num_heads=1, scale=value)


def test_an_infinite_value_is_told_it_must_be_finite():
    with pytest.raises(ValueError, match=r"^s must be positive, got inf \(it must be finite\)$"):
        positive_float("s", math.inf)
