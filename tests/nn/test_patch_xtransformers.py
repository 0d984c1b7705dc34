"""kattn.patch on x-transformers models: the core is replaced, the rest kept."""

import re
from pathlib import Path

import pytest
import torch

import kattn
from kattn.nn.patch_xtransformers import XTransformersAttend

from .test_patch import count_calls

xt = pytest.importorskip("x_transformers")

SIZES = {"dim": 32, "depth": 2, "heads": 4, "attn_dim_head": 8}


def wrapper(layers, *, tokens=50, max_len=32):
    torch.manual_seed(0)
    return xt.TransformerWrapper(num_tokens=tokens, max_seq_len=max_len, attn_layers=layers)


def tokens_and_mask():
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 50, (2, 11), generator=generator)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, -4:] = False  # x-transformers' mask: True keeps a token
    return x, mask


SOFTMAX_CASES = {
    "encoder_padding": lambda: xt.Encoder(**SIZES),
    "decoder_rotary": lambda: xt.Decoder(**SIZES, rotary_pos_emb=True, verbose=False),
    "grouped_kv_qk_norm": lambda: xt.Encoder(**SIZES, attn_kv_heads=2, attn_qk_norm=True),
    "value_head_size": lambda: xt.Encoder(**SIZES, attn_value_dim_head=12),
}


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_patch_keeps_outputs_and_really_runs(case):
    """float64: x-transformers' own softmax runs in float32, hence ~1e-7 differences."""
    model = wrapper(SOFTMAX_CASES[case]()).double().eval()
    x, mask = tokens_and_mask()
    with torch.no_grad():
        before = model(x, mask=mask)
        assert kattn.patch(model, mechanism="softmax") is model
        calls = count_calls(model)
        after = model(x, mask=mask)
    assert len(calls) == SIZES["depth"]
    torch.testing.assert_close(after[mask], before[mask], rtol=0, atol=1e-6)


def test_softmax_patch_of_an_encoder_decoder_with_cross_attention():
    torch.manual_seed(0)
    model = xt.XTransformer(dim=32, enc_num_tokens=50, enc_depth=1, enc_heads=4,
                            enc_max_seq_len=16, dec_num_tokens=50, dec_depth=1, dec_heads=4,
                            dec_max_seq_len=16).double().eval()  # fmt: skip
    src, src_mask = tokens_and_mask()
    tgt = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(src, tgt, mask=src_mask)
        kattn.patch(model, mechanism="softmax")
        calls = count_calls(model)
        after = model(src, tgt, mask=src_mask)
    assert len(calls) == 3  # encoder self, decoder self, decoder cross
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_performer_patch_runs_keeps_weights_and_stays_causal():
    model = wrapper(xt.Decoder(**SIZES)).eval()
    attention = model.attn_layers.layers[0][1]
    weight = attention.to_q.weight
    x, _ = tokens_and_mask()
    with torch.no_grad():
        before = model(x)
        kattn.patch(model, mechanism="performer", num_features=16)
        calls = count_calls(model)
        after = model(x)
        assert len(calls) == 2
        changed = x.clone()
        changed[:, 7] = (changed[:, 7] + 1) % 50
        later = model(changed)
    assert isinstance(attention.attend, XTransformersAttend)
    assert attention.to_q.weight is weight
    assert attention.attend.attention.feature_map.num_features == 16
    assert "attn_layers.layers.0.1.attend.attention.feature_map.projection" in model.state_dict()
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(later[:, :7], after[:, :7], rtol=0, atol=0)
    assert (later[:, 7:] - after[:, 7:]).abs().max() > 1e-3


def test_patching_again_changes_the_mechanism_and_keeps_the_scale():
    model = wrapper(SOFTMAX_CASES["grouped_kv_qk_norm"]()).double().eval()
    x, mask = tokens_and_mask()
    with torch.no_grad():
        before = model(x, mask=mask)
        kattn.patch(model, mechanism="performer", num_features=16)
        kattn.patch(model, mechanism="softmax")
        after = model(x, mask=mask)
    core = model.attn_layers.layers[0][1].attend
    assert core.scale == pytest.approx(10)  # x-transformers' qk_norm_scale, not 1/sqrt(8)
    assert type(core.attention).__name__ == "SoftmaxAttention"
    torch.testing.assert_close(after[mask], before[mask], rtol=0, atol=1e-6)


def test_generation_recomputes_the_prefix_with_the_cache_turned_off():
    model = wrapper(xt.Decoder(**SIZES)).eval()
    kattn.patch(model, mechanism="linear")
    assert not model.can_cache_kv and not model.attn_layers.can_cache_kv
    calls = count_calls(model)
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    out = xt.AutoregressiveWrapper(model).generate(prompt, 5, cache_kv=True)
    assert out.shape == (2, 5)
    assert len(calls) == 5 * SIZES["depth"]


def test_patched_model_trains():
    model = wrapper(xt.Encoder(**SIZES)).train()
    kattn.patch(model, mechanism="performer", num_features=16)
    assert all(m.training for m in model.modules())
    x, mask = tokens_and_mask()
    model(x, mask=mask).square().mean().backward()
    assert model.attn_layers.layers[0][1].to_q.weight.grad is not None


REFUSED = {
    "talking_heads": (lambda: xt.Encoder(**SIZES, attn_pre_talking_heads=True), "talking heads"),
    "memory_kv": (lambda: xt.Encoder(**SIZES, attn_num_mem_kv=2), "memory key/values"),
    "alibi": (lambda: xt.Encoder(**SIZES, alibi_pos_bias=True), "AlibiPositionalBias"),
    "t5_bias": (lambda: xt.Encoder(**SIZES, rel_pos_bias=True), "RelativePositionBias"),
    "sigmoid": (lambda: xt.Encoder(**SIZES, attn_sigmoid=True), "not a softmax"),
    "residual_attn": (lambda: xt.Encoder(**SIZES, residual_attn=True), "residual_attn=True"),
    "max_past": (lambda: xt.Decoder(**SIZES, attn_max_attend_past=4), "max_attend_past"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_mechanism_cannot_honour_is_refused_before_any_change(case):
    build, phrase = REFUSED[case]
    model = wrapper(build())
    with pytest.raises(NotImplementedError, match=phrase) as info:
        kattn.patch(model, mechanism="softmax")
    assert "attn_layers.layers.0.1" in str(info.value)
    assert not any(isinstance(m, XTransformersAttend) for m in model.modules())


def test_capabilities_the_mechanism_lacks_are_refused():
    with pytest.raises(NotImplementedError, match="mechanism 'nystromformer' has no causal"):
        kattn.patch(wrapper(xt.Decoder(**SIZES)), mechanism="nystromformer")
    torch.manual_seed(0)
    model = xt.XTransformer(dim=32, enc_num_tokens=50, enc_depth=1, enc_heads=4,
                            enc_max_seq_len=16, dec_num_tokens=50, dec_depth=1, dec_heads=4,
                            dec_max_seq_len=16)  # fmt: skip
    with pytest.raises(NotImplementedError, match=r"decoder\.net\.attn_layers\.layers\.1\.1 .*"
                       "cross-attention"):  # fmt: skip
        kattn.patch(model, mechanism="local")


def test_a_query_key_mask_at_call_time_is_refused():
    model = wrapper(xt.Encoder(**SIZES)).eval()
    kattn.patch(model, mechanism="softmax")
    x, _ = tokens_and_mask()
    pairs = torch.ones(11, 11, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="key padding only"):
        model(x, attn_mask=pairs)


def test_attention_dropout_goes_to_the_mechanism_or_is_announced():
    model = wrapper(xt.Encoder(**SIZES, attn_dropout=0.1))
    kattn.patch(model, mechanism="softmax")
    assert model.attn_layers.layers[0][1].attend.attention.dropout == 0.1
    model = wrapper(xt.Encoder(**SIZES, attn_dropout=0.1))
    with pytest.warns(UserWarning, match="dropout=0.1 is not applied") as record:
        kattn.patch(model, mechanism="performer")
    assert {w.filename for w in record} == {__file__}


def test_the_api_page_example_runs():
    page = Path(__file__).resolve().parents[2] / "docs" / "api.md"
    section = page.read_text().split("## `kattn.patch`", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(block, str(page), "exec"), namespace)
    assert isinstance(namespace["model"].attn_layers.layers[0][1].attend, XTransformersAttend)
    assert (namespace["after"] - namespace["before"]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_the_core_takes_the_models_dtype(dtype):
    torch.manual_seed(0)
    model = wrapper(xt.Encoder(dim=32, depth=1, heads=4)).to(dtype).eval()
    kattn.patch(model, mechanism="performer", num_features=16)
    core = model.attn_layers.layers[0][1].attend.attention
    assert {t.dtype for t in [*core.parameters(), *core.buffers()]} == {dtype}
    with torch.no_grad():
        assert model(torch.randint(0, 50, (1, 10))).dtype == dtype
