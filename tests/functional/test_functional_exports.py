"""Every name that kattn.functional exports is importable, documented, listed in docs/api.md."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import kattn.functional

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_exports_are_sorted_and_unique():
    names = kattn.functional.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name", kattn.functional.__all__)
def test_each_export_is_importable_and_documented(name):
    namespace: dict = {}
    exec(f"from kattn.functional import {name}", namespace)  # the import users write
    obj = namespace[name]
    doc = inspect.getdoc(obj)
    assert doc and doc.strip(), f"kattn.functional.{name} has no docstring"
    if inspect.isclass(obj):  # not a docstring inherited from a base such as NamedTuple
        assert obj.__doc__ and obj.__doc__.strip()


def test_the_api_page_lists_every_export():
    listed = set(re.findall(r"`([A-Za-z_0-9]+)`", API_PAGE.read_text()))
    missing = [name for name in kattn.functional.__all__ if name not in listed]
    assert not missing, f"docs/api.md does not list kattn.functional's {missing}"


@pytest.mark.parametrize(
    "module, names",
    [
        ("toeplitz", ["rpe_linear_attention_fft", "toeplitz_dense", "toeplitz_matmul"]),
        ("toeplitz2d", ["rpe2d_linear_attention_fft", "toeplitz2d_dense_log"]),
        ("rpe_blocked", ["rpe_linear_attention_blocked", "ToeplitzRows", "DenseRows"]),
        ("decay", ["decay_linear_attention", "decay_prefill", "decay_step", "decay_init_state"]),
        ("banded", ["banded_linear_attention", "banded_log_coefficients"]),
        ("banded_decoding", ["BandedState", "banded_init_state", "banded_step"]),
    ],
)
def test_the_relative_position_maths_is_exported(module, names):
    source = importlib.import_module(f"kattn.functional.{module}")
    for name in names:
        assert name in kattn.functional.__all__
        assert getattr(kattn.functional, name) is getattr(source, name)


def test_no_exported_name_hides_a_submodule():
    submodules = {m.name for m in pkgutil.iter_modules(kattn.functional.__path__)}
    assert not submodules & set(kattn.functional.__all__)


def test_the_api_page_example_of_kattn_functional_runs():
    section = API_PAGE.read_text().split("## `kattn.functional`", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the kattn.functional section of docs/api.md has no python example"
    for block in blocks:
        exec(compile(block, str(API_PAGE), "exec"), {})
