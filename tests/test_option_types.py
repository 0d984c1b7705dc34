"""Options of the wrong type are refused with a ``TypeError`` naming the option: a bool option
takes only True or False, a number option only a real number (never a bool or a string)."""

import inspect

import pytest

import kattn
from kattn import positional
from kattn.attention import KernelizedAttention, LinformerAttention
from kattn.registry import MECHANISMS

SIZES = {"head_dim": 8, "num_heads": 2, "max_len": 16}


def declared(name):
    """``(option, bad values)`` for every bool or float option of mechanism ``name``'s class,
    read from its signature."""
    for p in inspect.signature(MECHANISMS.get(name).cls.__init__).parameters.values():
        if isinstance(p.default, bool):
            yield p.name, ("x", 1, None)
        elif str(p.annotation).startswith("float"):
            yield p.name, ("x", True)


@pytest.mark.parametrize("name", kattn.available())
def test_bool_and_number_options_of_every_mechanism_refuse_other_types(name):
    for option, bad_values in declared(name):
        for bad in bad_values:
            with pytest.raises(TypeError, match=f"'{option}'"):
                kattn.build(name, **SIZES, **{option: bad})


def test_the_sweep_reaches_the_options_it_is_about():
    options = {name: dict(declared(name)) for name in kattn.available()}
    assert {"normalize_qk", "scale", "eps"} <= set(options["performer"])
    assert {"share_kv", "share_heads"} <= set(options["linformer"])
    assert {"scale", "dropout"} <= set(options["softmax"])


@pytest.mark.parametrize(
    ("name", "options", "option", "bad"),
    [
        ("performer", {}, "eps", "x"),
        ("performer", {}, "scale", "x"),
        ("softmax", {}, "scale", "x"),
        ("nprf_rpe", {}, "normalize_qk", "x"),
        ("linformer", {}, "share_kv", "yes"),
        ("linformer", {}, "share_heads", 0),
        ("kernelized", {"rpe": "bucketed"}, "bidirectional", "x"),
        ("fastfood_rks", {}, "sigma", "x"),
        ("ffk_linear", {}, "orthogonal_penalty", True),
    ],
    ids=lambda x: str(x) if not isinstance(x, dict) else "",
)
def test_named_options_refuse_other_types(name, options, option, bad):
    with pytest.raises(TypeError, match=f"'{option}'.*{bad!r}"):
        kattn.build(name, **SIZES, **options, **{option: bad})


def test_values_of_the_declared_types_are_accepted():
    attn = kattn.build("performer", **SIZES, normalize_qk=True, scale=1, eps=1e-6)
    assert attn.normalize_qk and attn.scale == 1.0 and attn.eps == 1e-6
    lin = kattn.build("linformer", **SIZES, share_kv=False, share_heads=True)
    assert (lin.share_kv, lin.share_heads) == (False, True)
    assert kattn.build("softmax", **SIZES, scale=None, dropout=0).dropout == 0.0
    rpe = kattn.build("kernelized", **SIZES, rpe="bucketed", bidirectional=False)
    assert rpe.rpe.bidirectional is False


def test_classes_built_directly_check_their_own_options():
    with pytest.raises(TypeError, match="'normalize_qk'"):
        KernelizedAttention(head_dim=8, num_heads=2, normalize_qk="x")
    with pytest.raises(TypeError, match="'eps'"):
        KernelizedAttention(head_dim=8, num_heads=2, eps="x")
    with pytest.raises(TypeError, match="'scale'"):
        KernelizedAttention(head_dim=8, num_heads=2, scale="x")
    with pytest.raises(TypeError, match="'share_heads'"):
        LinformerAttention(head_dim=8, num_heads=2, max_len=16, share_heads="x")
    with pytest.raises(TypeError, match="'bidirectional'"):
        positional.build("bucketed", num_heads=2, bidirectional="x")
    with pytest.raises(TypeError, match="'bidirectional'"):
        positional.BucketedBias(num_heads=2, bidirectional=1)
    with pytest.raises(TypeError, match="'dropout'"):
        kattn.build("gaussian", **SIZES, dropout="x")


def test_a_float_option_takes_a_python_or_numpy_real():
    np = pytest.importorskip("numpy")
    attn = kattn.build("softmax", **SIZES, dropout=np.float32(0.25))
    assert attn.dropout == 0.25
