"""``Attention.reference``: the dense O(Lq·Lk) form equals ``forward`` for every registered
mechanism (outputs and gradients), validates its inputs like ``forward`` and changes no state."""

import pytest
import torch

import kattn
from kattn.functional.rpe_blocked import DEFAULT_BLOCK_ELEMENTS

from ..helpers import assert_close, grads, padding_mask, qkv

D, H, DV, MAX_LEN = 16, 3, 8, 64
#: small chunks and blocks, and the FFT for Toeplitz encodings, so that the fast paths
#: (chunked, blocked, FFT) run at test lengths; each mechanism takes the ones it has.
FAST_PATHS = {"chunk_size": 8, "block_size": 16, "rpe_method": "fft"}
#: every mechanism's registered size option (features, landmarks, projected rows) is set to
#: this, below the test lengths, so that Nyström and Linformer approximate
SIZE = 12
CASES = {  # id: (Lq, Lk, causal, padded keys per batch row or None)
    "37": (37, 37, False, None),
    "37-causal": (37, 37, True, None),
    "37-pad": (37, 37, False, (0, 5)),
    "37-causal-pad": (37, 37, True, (0, 5)),
    "37x50": (37, 50, False, None),
    "50x37-pad": (50, 37, False, (4, 0)),
}
#: configurations beyond the registered presets: every encoding and method, the plain feature
#: maps without a preset, Nyströmformer's convolution and Skyformer's exact inverse.
EXTRA = {
    "identity": ("kernelized", {"feature_map": "identity"}),
    "relu": ("kernelized", {"feature_map": "relu"}),
    "decay-recurrent": ("performer", {"rpe": "decay"}),
    "decay-fft": ("performer", {"rpe": "decay", "rpe_method": "fft"}),
    "bucketed-banded": ("performer", {"rpe": "bucketed", "num_buckets": 8, "max_distance": 12}),
    "bucketed-fft": (
        "performer",
        {"rpe": "bucketed", "num_buckets": 8, "max_distance": 12, "rpe_method": "fft"},
    ),
    "toeplitz2d-fft": ("nprf_rpe", {"rpe": "toeplitz2d", "grid": (5, 7), "rpe_method": "fft"}),
    "nystromformer-conv": ("nystromformer", {"conv_kernel_size": 5}),
    "skyformer-exact-inverse": ("skyformer", {"pinv_iterations": None}),
}


def build(name, **options):
    """Mechanism ``name`` with the :data:`FAST_PATHS` options it accepts and its size option at
    :data:`SIZE` (``options`` win), and random positional coefficients (they start at 0, which
    would hide offset mix-ups)."""
    defaults = kattn.spec(name).defaults
    cls = type(kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **options))
    valid = cls.option_names({**defaults, **options}) or []
    size_option = kattn.spec(name).size_option
    sizes = {size_option: SIZE} if size_option else {}
    merged = {**{o: x for o, x in FAST_PATHS.items() if o in valid}, **sizes, **options}
    torch.manual_seed(0)
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **merged)
    rpe = getattr(attn, "rpe", None)
    if rpe is not None:
        with torch.no_grad():
            for p in rpe.parameters():
                p.add_(0.5 * torch.randn_like(p))
    return attn


def supported(name, case):
    spec = kattn.spec(name)
    lq, lk, causal, pads = CASES[case]
    return (
        (spec.supports_causal or not causal)
        and (spec.supports_cross or lq == lk)
        and (spec.supports_padding_mask or pads is None)
    )


def inputs(lq, lk, pads, *, dtype=torch.float64, seed=0):
    q, k, v = qkv(2, H, lq, lk, D, DV, seed=seed, dtype=dtype, requires_grad=True)
    return q, k, v, None if pads is None else padding_mask(2, lk, pads)


def compare(attn, q, k, v, *, causal, mask):
    """Forward and reference equal in float64: outputs, and gradients of q, k, v and of every
    parameter (the same ones unused by both)."""
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    assert ref.shape == out.shape and ref.dtype == out.dtype
    assert_close(out, ref)
    tensors = [q, k, v, *attn.parameters()]
    for fast, slow in zip(grads(out, *tensors), grads(ref, *tensors), strict=True):
        assert (fast is None) == (slow is None)
        if slow is not None:
            scale = max(1.0, float(slow.abs().max()))
            torch.testing.assert_close(fast, slow, rtol=1e-8, atol=1e-10 * scale)


@pytest.mark.parametrize(
    ("name", "case"),
    [(n, c) for n in kattn.available() for c in CASES if supported(n, c)],
)
def test_reference_equals_forward(name, case):
    lq, lk, causal, pads = CASES[case]
    attn = build(name).double().eval()
    q, k, v, mask = inputs(lq, lk, pads)
    compare(attn, q, k, v, causal=causal, mask=mask)


@pytest.mark.parametrize(
    ("config", "causal"),
    [
        (config, causal)
        for config, (name, _) in EXTRA.items()
        for causal in (False, True)
        if kattn.spec(name).supports_causal or not causal
    ],
)
def test_reference_equals_forward_in_other_configurations(config, causal):
    name, options = EXTRA[config]
    attn = build(name, **options).double().eval()
    length = 35 if "grid" in options else 37  # the 5×7 grid
    q, k, v, mask = inputs(length, length, (0, 5))
    compare(attn, q, k, v, causal=causal, mask=mask)


def test_positional_coefficients_are_not_trivial_in_these_tests():
    attn = build("prf_rpe")
    assert attn.rpe is not None
    assert attn.rpe.dense(5, 5).std() > 0.1


def scale_relative(out, ref, tol):
    """``out`` equals ``ref`` up to ``tol`` relative to each entry and to the largest one."""
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol * float(ref.detach().abs().max()))


def fp32_tolerance(attn):
    """Feature maps of either sign (cos/sin, identity) leave normalisers that sum terms of
    both signs: in float32 forward and reference are then each about 1e-4 of the output scale
    from the float64 result, by rounding alone. Elsewhere they agree to about 1e-6."""
    feature_map = getattr(attn, "feature_map", None)
    return 2e-3 if feature_map is not None and not feature_map.positive else 1e-4


@pytest.mark.parametrize("name", kattn.available())
def test_reference_in_float32(name):
    attn = build(name).eval()
    q, k, v, mask = inputs(37, 37, (0, 5), dtype=torch.float32)
    for causal in [False, True] if attn.supports_causal else [False]:
        out = attn(q, k, v, causal=causal, key_padding_mask=mask)
        ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
        assert ref.dtype == torch.float32
        scale_relative(out, ref, fp32_tolerance(attn))


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("performer", {}),
        ("prf_rpe", {}),
        ("nprf_rpe", {}),
        ("prf_rpe", {"rpe_method": "fft"}),
        ("nprf_rpe", {"rpe_method": "fft"}),
    ],
    ids=["performer", "prf_rpe", "nprf_rpe", "prf_rpe-fft", "nprf_rpe-fft"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_reference_checks_the_default_long_sequence_paths(name, options, causal):
    # default options: 64-token chunks in causal mode, and for the Toeplitz encodings the
    # path "auto" picks on the CPU (the blocked exact form, in many blocks at this length)
    length, heads = 1500, 2
    assert heads * length * length > DEFAULT_BLOCK_ELEMENTS
    torch.manual_seed(0)
    attn = kattn.build(
        name, head_dim=D, num_heads=heads, max_len=length, num_features=32, **options
    )
    if attn.rpe is not None:
        with torch.no_grad():
            attn.rpe.bias.normal_()
    q, k, v = qkv(1, heads, length, length, D, DV, dtype=torch.float32)
    mask = padding_mask(1, length, (7,))
    out = attn(q, k, v, causal=causal, key_padding_mask=mask)
    ref = attn.reference(q, k, v, causal=causal, key_padding_mask=mask)
    scale_relative(out, ref, 1e-4)


def snapshot(attn):
    """Everything a call could change: parameters, buffers and extra state (redraw counters),
    the training flag of every submodule, recorded losses and torch's global RNG."""
    state = {
        key: value.detach().clone() if isinstance(value, torch.Tensor) else value
        for key, value in attn.state_dict().items()
    }
    flags = [m.training for m in attn.modules()]
    return state, flags, attn.regularization_loss().detach().clone(), torch.get_rng_state()


def assert_same_snapshot(before, after):
    (state_a, flags_a, loss_a, rng_a), (state_b, flags_b, loss_b, rng_b) = before, after
    assert state_a.keys() == state_b.keys()
    for key, value in state_a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, state_b[key]), key
        else:
            assert value == state_b[key], key
    assert flags_a == flags_b
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(rng_a, rng_b)


@pytest.mark.parametrize("name", kattn.available())
def test_reference_changes_no_state_and_gives_the_evaluation_output(name):
    attn = build(name).double().train()
    q, k, v, mask = inputs(37, 37, (0, 5))
    attn(*inputs(37, 37, None, seed=1)[:3])  # a training forward: records losses, counts steps
    before = snapshot(attn)
    ref = attn.reference(q, k, v, key_padding_mask=mask)
    assert_same_snapshot(before, snapshot(attn))
    attn.eval()
    assert_close(attn(q, k, v, key_padding_mask=mask), ref)


def test_reference_restores_mixed_training_flags():
    attn = build("ffk_ae", rpe="decay").train()
    attn.rpe.eval()
    flags = [m.training for m in attn.modules()]
    assert len(set(flags)) == 2
    attn.reference(*inputs(7, 7, None, dtype=torch.float32)[:3])
    assert [m.training for m in attn.modules()] == flags


def test_reference_never_redraws_random_features():
    torch.manual_seed(0)
    attn = kattn.build("performer", head_dim=D, num_heads=H, redraw=1).train()
    q, k, v, _ = inputs(9, 9, None, dtype=torch.float32)
    projection = attn.feature_map.projection.clone()
    steps = attn.feature_map.get_extra_state()
    for _ in range(3):
        attn.reference(q, k, v, causal=True)
    assert torch.equal(attn.feature_map.projection, projection)
    assert attn.feature_map.get_extra_state() == steps
    attn(q, k, v)  # redraw=1: a training forward does redraw, so the check above can fail
    assert not torch.equal(attn.feature_map.projection, projection)


def test_reference_without_dropout_in_training():
    attn = kattn.build("softmax", head_dim=D, num_heads=H, dropout=0.5).train()
    q, k, v, _ = inputs(11, 11, None, dtype=torch.float32)
    ref = attn.reference(q, k, v)
    assert attn.training
    assert_close(ref, attn.eval()(q, k, v))


@pytest.mark.parametrize("name", kattn.available())
def test_reference_validates_inputs_like_forward(name):
    attn = build(name)
    q, k, v, _ = inputs(5, 5, None, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"q must be 4-D \(B, H, L, D\)"):
        attn.reference(q[0], k, v)
    with pytest.raises(ValueError, match="k and v must have the same length"):
        attn.reference(q, k, v[:, :, :-1])
    with pytest.raises(ValueError, match="key_padding_mask must be a bool"):
        attn.reference(q, k, v, key_padding_mask=torch.zeros(2, 5))
    if not attn.supports_causal:
        with pytest.raises(NotImplementedError, match="does not support causal"):
            attn.reference(q, k, v, causal=True)


def test_reference_arguments_after_v_are_keywords():
    attn = kattn.build("softmax", head_dim=D, num_heads=H)
    q, k, v, _ = inputs(5, 5, None, dtype=torch.float32)
    with pytest.raises(TypeError):
        attn.reference(q, k, v, True)


def test_a_mechanism_without_a_reference_says_so():
    class NoReference(kattn.Attention):
        def _attend(self, q, k, v, *, causal, key_padding_mask):
            return v

    attn = NoReference(head_dim=D, num_heads=H)
    q, k, v, _ = inputs(5, 5, None, dtype=torch.float32)
    assert attn(q, k, v) is v
    with pytest.raises(NotImplementedError, match="NoReference has no dense reference"):
        attn.reference(q, k, v)
    with pytest.raises(ValueError, match="q must be 4-D"):  # validated first, like forward
        attn.reference(q[0], k, v)


def test_every_registered_mechanism_has_a_reference():
    q, k, v, _ = inputs(6, 6, None, dtype=torch.float32)
    for name in kattn.available():
        attn = kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN)
        assert type(attn)._reference is not kattn.Attention._reference, name
        assert attn.reference(q, k, v).shape == (2, H, 6, DV), name
