"""Registration cannot be forgotten: every module of ``kattn.attention``, ``kattn.features`` and
``kattn.positional`` is imported with its package and registers something, and a mechanism's
registration carries everything the tools read about it."""

import importlib
import pkgutil

import pytest

import kattn
from kattn.bench.mechanism_error import EXACT_REFERENCES
from kattn.registry import (
    ENCODINGS,
    FEATURE_MAPS,
    MECHANISMS,
    Registry,
    caller_module,
    derived_colour,
)

PACKAGES = ("kattn.attention", "kattn.features", "kattn.positional")
REGISTRIES = (MECHANISMS, FEATURE_MAPS, ENCODINGS)


def modules(package_name):
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        yield package, info.name


@pytest.mark.parametrize(
    "package, module",
    [(p.__name__, m) for name in PACKAGES for p, m in modules(name)],
    ids=lambda x: x,
)
def test_every_module_is_imported_and_registers_something(package, module):
    pkg = importlib.import_module(package)
    assert module in pkg.MODULES, f"{package}.{module} was not imported with its package"
    registered = [n for r in REGISTRIES for n in r.registered_in(f"{package}.{module}")]
    if module in pkg.SUPPORT_MODULES:
        assert registered == [], f"support module {package}.{module} registers {registered}"
    else:
        assert registered, (
            f"{package}.{module} registers nothing: register its mechanism, feature map or "
            f"encoding there, or list it in {package}.SUPPORT_MODULES if it is shared machinery"
        )


def test_the_registering_module_is_recorded():
    assert MECHANISMS.get("performer").module == "kattn.attention.kernelized"
    assert MECHANISMS.get("gmm_prf").module == "kattn.attention.learned_kernels"
    assert FEATURE_MAPS.get("prf").module == "kattn.features.random_features"
    assert ENCODINGS.get("toeplitz2d").module == "kattn.positional.toeplitz"
    assert caller_module(1) == __name__


class _Thing:
    def __init__(self, *, size: int, flag: bool = False, rate: float = 0.5) -> None:
        self.size, self.flag, self.rate = size, flag, rate


def test_the_generic_registry_builds_with_checked_options():
    reg: Registry[_Thing] = Registry("thing", build_args=("size",))
    reg.register("plain", _Thing)
    reg.register("flagged", _Thing, {"flag": True})
    assert reg.available() == ["flagged", "plain"] and "plain" in reg
    assert reg.option_names("plain") == ["flag", "rate"]
    built = reg.build("flagged", size=3, rate=2)
    assert (built.size, built.flag, built.rate) == (3, True, 2)
    with pytest.raises(TypeError, match=r"thing 'plain': unknown option\(s\) 'rates'"):
        reg.build("plain", size=3, rates=1.0)
    with pytest.raises(TypeError, match="option 'flag' must be a bool"):
        reg.build("plain", size=3, flag=1)
    with pytest.raises(ValueError, match="unknown thing 'other'; registered ones are: flagged"):
        reg.get("other")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("plain", _Thing)


def test_feature_maps_and_encodings_use_the_same_checks():
    with pytest.raises(TypeError, match="feature map 'prf': unknown option"):
        kattn.features.build("prf", head_dim=8, num_heads=1, num_landmarks=4)
    with pytest.raises(TypeError, match="relative positional encoding 'decay': unknown option"):
        kattn.positional.build("decay", num_heads=1, num_buckets=4)
    assert kattn.features.get("prf") is kattn.features.PositiveRandomFeatures
    assert kattn.positional.get("decay") is kattn.positional.DecayBias


@pytest.mark.parametrize("name", kattn.available())
def test_the_registration_describes_the_mechanism(name):
    spec = kattn.spec(name)
    assert spec.colour.startswith("#") and len(spec.colour) == 7
    if spec.size_option is not None:
        assert spec.size_option in MECHANISMS.option_names(name)
        small = kattn.build(name, head_dim=8, num_heads=2, max_len=32, **{spec.size_option: 4})
        large = kattn.build(name, head_dim=8, num_heads=2, max_len=32, **{spec.size_option: 8})
        assert sizes(small) != sizes(large), f"{spec.size_option} does not size {name}"
    if spec.approximates is not None:
        assert spec.approximates in EXACT_REFERENCES
        # an exact mechanism stands in for a full attention only over a restricted pattern
        assert not spec.is_exact or callable(getattr(MECHANISMS.get(name).cls, "pattern", None))


def sizes(module):
    """The shapes of a module's parameters and buffers, and its feature count if it has one."""
    tensors = [*module.parameters(), *module.buffers()]
    fm = getattr(module, "feature_map", None)
    return [tuple(t.shape) for t in tensors], getattr(fm, "num_features", None), repr(module)


def test_registered_colours_are_distinct():
    colours = [kattn.spec(n).colour for n in kattn.available()]
    assert len(set(colours)) == len(colours)


def test_a_colour_derived_from_the_name_is_stable_and_apart_from_the_registered_ones():
    registered = {kattn.spec(n).colour for n in kattn.available()}
    derived = [derived_colour(f"mechanism_{i}") for i in range(200)]
    assert derived == [derived_colour(f"mechanism_{i}") for i in range(200)]
    assert all(len(c) == 7 and c.startswith("#") for c in derived)
    assert not registered & set(derived) and len(set(derived)) > 150


def test_a_name_that_is_not_a_string_is_a_type_error():
    with pytest.raises(TypeError):
        kattn.build(["performer"], head_dim=8, num_heads=1)
