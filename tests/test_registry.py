import pytest
import torch

import kattn
from kattn.registry import CAPABILITY_FLAGS, MECHANISMS, Registry, register_mechanism

FOUNDATION = {"softmax", "linear", "performer", "rfa", "kernelized"}


def test_available_is_sorted_and_has_the_foundation_mechanisms():
    names = kattn.available()
    assert names == sorted(names)
    assert set(names) >= FOUNDATION


def test_feature_maps_are_listed():
    assert {"elu", "relu", "identity", "prf", "trf"} <= set(kattn.features.available())


def test_registry_refuses_duplicates():
    reg: Registry[object] = Registry("thing")
    reg.register("a", int)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", float)
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism(
            "softmax", MECHANISMS.get("softmax").cls, summary="x", reference="x", complexity="x"
        )
    with pytest.raises(ValueError, match="already registered"):
        kattn.features.register_feature_map("prf", kattn.features.PositiveRandomFeatures)


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match="performer"):
        kattn.build("no_such_mechanism", head_dim=8, num_heads=1)
    with pytest.raises(ValueError, match="prf"):
        kattn.build("kernelized", head_dim=8, num_heads=1, feature_map="no_such_map")


def test_unknown_option_names_the_option_and_the_valid_ones():
    with pytest.raises(TypeError) as err:
        kattn.build("performer", head_dim=8, num_heads=1, num_feature=32)
    message = str(err.value)
    assert "'num_feature'" in message and "num_features" in message and "sampling" in message


def test_options_follow_the_feature_map():
    attn = kattn.build("kernelized", head_dim=8, num_heads=1, feature_map="prf", num_features=32)
    assert attn.feature_map.num_features == 32
    with pytest.raises(TypeError, match="num_features"):
        kattn.build("kernelized", head_dim=8, num_heads=1, feature_map="elu", num_features=32)


@pytest.mark.parametrize("name", kattn.available())
def test_spec_describes_the_default_module(name):
    spec = kattn.spec(name)
    assert spec.name == name and spec.summary and spec.reference and spec.complexity
    attn = kattn.build(name, head_dim=8, num_heads=2, max_len=16)
    for flag in CAPABILITY_FLAGS:
        assert getattr(spec, flag) is getattr(attn, flag)


def test_spec_of_exactness():
    assert kattn.spec("softmax").is_exact
    assert not kattn.spec("performer").is_exact
    assert kattn.spec("performer").supports_recurrent
    assert kattn.spec("softmax").supports_recurrent  # with a growing key/value cache


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="head_dim"):
        kattn.build("linear", head_dim=bad, num_heads=1)
    with pytest.raises(ValueError, match="num_heads"):
        kattn.build("linear", head_dim=8, num_heads=bad)


def test_build_gives_independent_modules():
    torch.manual_seed(0)
    a = kattn.build("performer", head_dim=8, num_heads=1)
    b = kattn.build("performer", head_dim=8, num_heads=1)
    assert not torch.equal(a.feature_map.projection, b.feature_map.projection)
