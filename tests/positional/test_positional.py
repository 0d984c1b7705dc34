"""Relative positional encodings as modules inside ``kernelized`` attention (``rpe=...``)."""

import pytest
import torch

import kattn
from kattn import positional
from kattn.positional import t5_buckets

from ..helpers import assert_close, grads, padding_mask, qkv, step_through

H, D, MAX_LEN = 3, 16, 64


def build(name="kernelized", *, seed=0, **options):
    torch.manual_seed(seed)
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN, **options)
    return attn.double().eval()


def randomize(attn, seed=1):
    """Give the encoding's parameters non-trivial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.rpe.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return attn


METHODS = {
    "toeplitz": ("auto", "fft"),
    "bucketed": ("banded", "fft"),
    "decay": ("recurrent", "fft"),
}


@pytest.mark.parametrize(
    ("rpe", "method"), [(r, m) for r, ms in METHODS.items() for m in ms], ids=lambda x: str(x)
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_method_equals_the_dense_reference(rpe, method, causal):
    extra = {"num_buckets": 8, "max_distance": 12} if rpe == "bucketed" else {}
    fast = randomize(build(feature_map="prf", rpe=rpe, rpe_method=method, **extra))
    dense = build(feature_map="prf", rpe=rpe, rpe_method="dense", **extra)
    dense.load_state_dict(fast.state_dict())
    q, k, v = qkv(lq=41, requires_grad=True)
    mask = padding_mask(2, 41, (0, 5))
    out = fast(q, k, v, causal=causal, key_padding_mask=mask)
    ref = dense(q, k, v, causal=causal, key_padding_mask=mask)
    assert_close(out, ref)
    params = [*fast.rpe.parameters()]
    ref_params = [*dense.rpe.parameters()]
    for a, b in zip(grads(out, q, k, v, *params), grads(ref, q, k, v, *ref_params), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("feature_map", kattn.features.available())
@pytest.mark.parametrize("rpe", ["bucketed", "decay", "toeplitz"])
def test_composes_with_every_feature_map(feature_map, rpe):
    fast = randomize(build(feature_map=feature_map, rpe=rpe))
    dense = build(feature_map=feature_map, rpe=rpe, rpe_method="dense")
    dense.load_state_dict(fast.state_dict())
    q, k, v = qkv(lq=23)
    for causal in (False, True):
        assert_close(fast(q, k, v, causal=causal), dense(q, k, v, causal=causal))


def test_toeplitz_bias_layout_and_dense_matrix():
    attn = build(feature_map="prf", rpe="toeplitz")
    bias = attn.rpe.bias
    assert bias.shape == (H, 2 * MAX_LEN - 1)
    with torch.no_grad():
        bias[1, 3 + MAX_LEN - 1] = 2.0  # offset j − i = 3
    c = attn.rpe.dense(6, 9)
    assert c.shape == (H, 6, 9)
    assert torch.allclose(c[1, 2, 5], torch.tensor(2.0, dtype=c.dtype).exp())
    assert torch.allclose(c[0], torch.ones(6, 9, dtype=c.dtype))
    causal = attn.rpe.dense(6, 6, causal=True)
    below = torch.ones(6, 6, dtype=torch.bool).tril()
    assert (causal[:, ~below] == 0).all() and (causal[:, below] > 0).all()


def test_nprf_rpe_with_zero_bias_is_nprf():
    rpe = build("nprf_rpe")
    assert rpe.rpe.bias.abs().sum() == 0  # initialised at 0
    plain = build(feature_map="prf", normalize_qk=True)
    plain.load_state_dict(rpe.state_dict(), strict=False)
    q, k, v = qkv(lq=30)
    mask = padding_mask(2, 30, (4, 0))
    for causal in (False, True):
        assert_close(
            rpe(q, k, v, causal=causal, key_padding_mask=mask),
            plain(q, k, v, causal=causal, key_padding_mask=mask),
        )


def test_presets_and_capabilities():
    spec = kattn.spec("nprf_rpe")
    assert spec.defaults == {"feature_map": "prf", "normalize_qk": True, "rpe": "toeplitz"}
    assert spec.supports_causal and spec.supports_cross and spec.supports_recurrent
    assert kattn.spec("prf_rpe").defaults == {"feature_map": "prf", "rpe": "toeplitz"}
    assert build("nprf_rpe").normalize_qk and not build("prf_rpe").normalize_qk
    flags = {
        name: build(feature_map="elu", rpe=name, **({"grid": (4, 4)} if "2d" in name else {}))
        for name in positional.available()
    }
    assert {n: a.supports_recurrent for n, a in flags.items()} == {
        "bucketed": True,
        "decay": True,
        "toeplitz": True,
        "toeplitz2d": True,
    }
    assert not flags["toeplitz2d"].supports_cross
    assert flags["toeplitz"].limits_length and not flags["bucketed"].limits_length


@pytest.mark.parametrize("rpe", ["bucketed", "decay", "toeplitz"])
def test_recurrent_steps_equal_the_causal_forward(rpe):
    extra = {"num_buckets": 8, "max_distance": 10} if rpe == "bucketed" else {}
    attn = randomize(build(feature_map="prf", rpe=rpe, **extra))
    q, k, v = qkv(lq=33)
    full = attn(q, k, v, causal=True)
    steps, _ = step_through(attn.step, q, k, v, attn.init_state(2, H, dtype=q.dtype))
    assert_close(steps, full)


def test_auto_method_picks_dense_for_small_problems_and_fft_beyond(monkeypatch):
    from kattn.positional import base

    attn = randomize(build(feature_map="prf", rpe="toeplitz"))
    assert attn.rpe.method == "auto"
    q, k, v = qkv(lq=33)
    calls = []
    for name in ("_attend_dense", "_attend_fft"):
        original = getattr(attn.rpe, name)
        setattr(
            attn.rpe, name, lambda *a, _o=original, _n=name, **kw: calls.append(_n) or _o(*a, **kw)
        )
    small = attn(q, k, v)
    monkeypatch.setattr(base, "prefer_blocked", lambda *a, **kw: False)
    large = attn(q, k, v)
    assert calls == ["_attend_dense", "_attend_fft"]
    assert_close(small, large)


@pytest.mark.parametrize(
    ("m", "length", "causal", "expected"),
    [
        (32, 4096, False, True),  # measured: blocked 31 ms, FFT 104 ms
        (32, 16384, False, False),  # blocked 488 ms, FFT 363 ms
        (32, 16384, True, True),  # blocked 357 ms, FFT 823 ms
        (64, 16384, False, True),  # blocked 561 ms, FFT 824 ms
        (256, 4096, True, True),  # blocked 44 ms, FFT 1742 ms
        (256, 16384, False, True),  # blocked 1.1 s, FFT ≈ 28 s
    ],
)
def test_cpu_cost_model_agrees_with_measured_choices(m, length, causal, expected):
    from kattn.functional.rpe_blocked import blocked_is_cheaper
    from kattn.functional.toeplitz import fft_length

    points = fft_length(2 * length - 1)
    assert blocked_is_cheaper(1, length, length, m, 64, points, causal=causal) is expected


def test_toeplitz_decoding_stops_at_max_len():
    attn = kattn.build("nprf_rpe", head_dim=D, num_heads=H, max_len=4)
    q, k, v = qkv(lq=5, dtype=torch.float32)
    _, state = step_through(attn.step, q[:, :, :4], k[:, :, :4], v[:, :, :4], attn.init_state(2, H))
    with pytest.raises(ValueError, match="max_len"):
        attn.step(q[:, :, 4:5], k[:, :, 4:5], v[:, :, 4:5], state)


def test_2d_encoding_on_a_grid():
    attn = randomize(build(feature_map="prf", rpe="toeplitz2d", grid=(4, 5)))
    dense = build(feature_map="prf", rpe="toeplitz2d", grid=(4, 5), rpe_method="dense")
    dense.load_state_dict(attn.state_dict())
    assert attn.rpe.bias.shape == (H, 7, 9)
    q, k, v = qkv(lq=20)
    for causal in (False, True):
        assert_close(attn(q, k, v, causal=causal), dense(q, k, v, causal=causal))
    c = attn.rpe.dense(20, 20)
    b = attn.rpe.bias.detach()
    # cell (1, 2) = token 7 looking at cell (3, 0) = token 15: Δrow = 2, Δcol = −2
    assert torch.allclose(c[2, 7, 15], b[2, 2 + 3, -2 + 4].exp())
    with pytest.raises(ValueError, match="Lq = Lk = 20"):
        attn(*qkv(lq=19))
    with pytest.raises(NotImplementedError, match="Lq == Lk"):
        attn(*qkv(lq=19, lk=20))  # cross-attention refused


def test_one_module_shared_across_layers():
    shared = positional.build("bucketed", num_heads=H)
    a = kattn.build("kernelized", head_dim=D, num_heads=H, feature_map="prf", rpe=shared)
    b = kattn.build("kernelized", head_dim=D, num_heads=H, feature_map="elu", rpe=shared)
    assert a.rpe is b.rpe is shared
    model = torch.nn.ModuleList([a, b])
    assert sum(p is shared.bias for p in model.parameters()) == 1
    with pytest.raises(ValueError, match="heads"):
        kattn.build("kernelized", head_dim=D, num_heads=H + 1, rpe=shared)


def test_bad_options_are_refused():
    with pytest.raises(TypeError, match="num_buckets"):
        build(rpe="toeplitz", num_buckets=4)  # an option of another encoding
    with pytest.raises(ValueError, match="method"):
        build(rpe="toeplitz", rpe_method="banded")
    with pytest.raises(ValueError, match="max_len"):
        kattn.build("nprf_rpe", head_dim=D, num_heads=H)
    with pytest.raises(ValueError, match="grid"):
        build(rpe="toeplitz2d")
    with pytest.raises(ValueError, match="unknown relative positional encoding"):
        build(rpe="rotary")
    with pytest.raises(TypeError, match="rpe must be"):
        build(rpe=3)
    with pytest.raises(ValueError, match="decay_terms"):
        build(rpe="decay", decay_terms=0)
    with pytest.raises(ValueError, match="max_len"):
        build("nprf_rpe")(*qkv(lq=MAX_LEN + 1))


def test_t5_buckets_and_the_band():
    offsets = torch.arange(-200, 201)
    b = t5_buckets(offsets, num_buckets=32, max_distance=128)
    at = dict(zip(offsets.tolist(), b.tolist(), strict=True))
    assert [at[o] for o in (0, -1, -7, 1, 7)] == [0, 1, 7, 17, 23]  # exact near 0
    assert at[-128] == at[-200] == 15 and at[128] == at[200] == 31  # last bucket beyond
    past = [at[-n] for n in range(1, 201)]
    assert past == sorted(past)  # monotone in the distance
    enc = positional.build("bucketed", num_heads=1)
    left, right = enc.left, enc.right
    assert all(at[-n] == at[-left] for n in range(left, 201)) and at[-(left - 1)] != at[-left]
    assert all(at[n] == at[right] for n in range(right, 201)) and at[right - 1] != at[right]
    causal_only = t5_buckets(offsets, num_buckets=16, max_distance=64, bidirectional=False)
    assert (causal_only[offsets >= 0] == 0).all()


def test_decay_initialisation_and_ranges():
    enc = positional.build("decay", num_heads=2, decay_terms=3)
    gamma = enc.log_gamma().exp()
    assert gamma.shape == (2, 2, 3) and ((gamma > 0) & (gamma < 1)).all()
    assert_close(gamma[0, 0], torch.tensor([0.75, 1 - 2**-5, 1 - 2**-8]))
    assert_close(enc.log_alpha.exp().sum(-1), torch.ones(2, 2))
    c = enc.dense(4, 4)
    assert_close(c[0, 0, 0], torch.tensor(1.0))  # Σ α_r at offset 0


def test_half_precision_through_the_module():
    for rpe in ("bucketed", "decay", "toeplitz"):
        attn = kattn.build("kernelized", head_dim=D, num_heads=H, max_len=MAX_LEN,
                           feature_map="prf", normalize_qk=True, rpe=rpe).eval()  # fmt: skip
        q, k, v = qkv(lq=40, dtype=torch.float32, scale=3.0)
        for causal in (False, True):
            ref = attn(q, k, v, causal=causal)
            out = attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal)
            assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
            assert (out.float() - ref).norm() / ref.norm() < 0.03


def test_dense_method_never_scales_by_a_future_key():
    attn = build(feature_map="prf", rpe="toeplitz", rpe_method="dense")
    q, k, v = qkv(lq=20)
    k2 = k.clone()
    k2[:, :, 10:] *= 40.0  # huge future log-scales
    out, out2 = attn(q, k, v, causal=True), attn(q, k2, v, causal=True)
    assert_close(out[:, :, :10], out2[:, :, :10])


def test_encoding_options_with_a_module_are_refused():
    shared = positional.build("bucketed", num_heads=H)
    with pytest.raises(TypeError, match="max_distance"):
        kattn.build("kernelized", head_dim=D, num_heads=H, rpe=shared, max_distance=64)
    with pytest.raises(ValueError, match="num_buckets"):
        positional.build("bucketed", num_heads=H, num_buckets=8.0)


def test_a_narrow_band_keeps_the_query_chunks():
    attn = randomize(build(feature_map="prf", rpe="bucketed", num_buckets=4, max_distance=3))
    dense = build(feature_map="prf", rpe="bucketed", num_buckets=4, max_distance=3,
                  rpe_method="dense")  # fmt: skip
    dense.load_state_dict(attn.state_dict())
    assert (attn.rpe.left, attn.rpe.right) == (1, 1)
    q, k, v = qkv(lq=70)
    for causal in (False, True):
        assert_close(attn(q, k, v, causal=causal), dense(q, k, v, causal=causal))


@pytest.mark.parametrize(
    ("rpe", "method"),
    [(r, m) for r in positional.available() for m in positional.get(r).methods],
    ids=lambda x: str(x),
)
def test_an_empty_batch_by_every_method(rpe, method):
    extra = {"grid": (3, 3)} if rpe == "toeplitz2d" else {}
    attn = build(feature_map="prf", rpe=rpe, rpe_method=method, **extra)
    q, k, v = qkv(b=0, lq=9, requires_grad=True)
    for causal in (False, True):
        out = attn(q, k, v, causal=causal, key_padding_mask=torch.zeros(0, 9, dtype=torch.bool))
        assert out.shape == (0, H, 9, v.shape[-1])
        assert [g.shape for g in grads(out, q, k, v)] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("rpe", ["bucketed", "decay", "toeplitz"])
def test_steps_refuse_a_state_of_another_batch_size(rpe):
    attn = build(feature_map="prf", rpe=rpe)
    q, k, v = qkv(b=3, lq=1)
    _, state = attn.step(q, k, v, attn.init_state(3, H, dtype=torch.float64))
    for bad in (attn.init_state(3, H, dtype=torch.float64), state):
        with pytest.raises(ValueError, match="state"):
            attn.step(q[:2], k[:2], v[:2], bad)
