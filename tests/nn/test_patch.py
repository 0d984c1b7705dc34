"""kattn.patch on PyTorch's own Transformer modules."""

import pytest
import torch

import kattn


def encoder(**kwargs):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        24, 4, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    return torch.nn.TransformerEncoder(layer, num_layers=2, **kwargs).eval()


def count_calls(model):
    """A list that every forward of a kattn mechanism inside ``model`` appends to."""
    calls = []
    for module in model.modules():
        if isinstance(module, kattn.Attention):
            module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested_tensor_default"])
def test_softmax_patch_keeps_outputs_and_really_runs(nested):
    """Also with enable_nested_tensor=True (the default), where PyTorch's fused path would
    otherwise bypass the attention module in eval mode."""
    model = encoder(enable_nested_tensor=nested)
    x = torch.randn(2, 10, 24)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, -4:] = True
    with torch.no_grad():
        before = model(x, src_key_padding_mask=mask)
        kattn.patch(model, mechanism="softmax")
        calls = count_calls(model)
        after = model(x, src_key_padding_mask=mask)
    assert len(calls) == 2
    keep = ~mask
    torch.testing.assert_close(after[keep], before[keep], rtol=1e-4, atol=1e-5)


def test_performer_patch_changes_outputs_and_keeps_weights():
    model = encoder(enable_nested_tensor=False)
    weight = model.layers[0].self_attn.in_proj_weight.detach().clone()
    x = torch.randn(2, 10, 24)
    with torch.no_grad():
        before = model(x)
        kattn.patch(model, mechanism="performer", num_features=32)
        after = model(x)
    layer_attn = model.layers[0].self_attn
    assert isinstance(layer_attn, kattn.MultiheadAttention)
    assert torch.equal(layer_attn.in_proj_weight, weight)
    assert layer_attn.attention.feature_map.num_features == 32
    assert (before - after).abs().max() > 1e-3


def test_decoder_with_causal_mask_and_cross_attention():
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(
        24, 4, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    model = torch.nn.TransformerDecoder(layer, num_layers=2).eval()
    tgt, memory = torch.randn(2, 7, 24), torch.randn(2, 11, 24)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(7)
    with torch.no_grad():
        before = model(tgt, memory, tgt_mask=causal, tgt_is_causal=True)
        kattn.patch(model, mechanism="softmax")
        after = model(tgt, memory, tgt_mask=causal, tgt_is_causal=True)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    assert sum(isinstance(m, kattn.MultiheadAttention) for m in model.modules()) == 4


def test_patching_keeps_training_mode_and_trains():
    model = encoder(enable_nested_tensor=False).train()
    kattn.patch(model, mechanism="linear")
    assert all(m.training for m in model.modules())
    x = torch.randn(2, 6, 24)
    model(x).square().mean().backward()
    assert model.layers[0].self_attn.in_proj_weight.grad is not None


def test_patch_a_bare_module_and_refuse_models_without_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(24, 4)
    patched = kattn.patch(mha, mechanism="performer")
    assert isinstance(patched, kattn.MultiheadAttention)
    with pytest.raises(ValueError, match=r"no torch\.nn\.MultiheadAttention"):
        kattn.patch(torch.nn.Linear(3, 3), mechanism="performer")


class Tied(torch.nn.Module):
    """One attention module used in two places (weights shared between two passes)."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.MultiheadAttention(24, 4, batch_first=True)
        self.second = self.first
        self.inner = torch.nn.Sequential(self.first)

    def forward(self, x):
        x = x + self.first(x, x, x, need_weights=False)[0]
        return self.inner[0](x, x, x, need_weights=False)[0]


def test_a_module_used_in_several_places_stays_shared():
    torch.manual_seed(0)
    model = Tied().eval()
    count = sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x)
        kattn.patch(model, mechanism="softmax")
        after = model(x)
    assert isinstance(model.first, kattn.MultiheadAttention)
    assert model.second is model.first and model.inner[0] is model.first
    assert sum(p.numel() for p in model.parameters()) == count
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)


def test_the_dropout_warning_points_at_the_callers_line():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(24, 4, dim_feedforward=32, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
    with pytest.warns(UserWarning, match="dropout") as record:
        kattn.patch(model, mechanism="performer")
    assert {w.filename for w in record if "dropout" in str(w.message)} == {__file__}
    with pytest.warns(UserWarning, match="dropout") as record:
        kattn.MultiheadAttention(24, 4, dropout=0.1, mechanism="performer")
    assert [w.filename for w in record] == [__file__]
    with pytest.warns(UserWarning, match="dropout") as record:
        kattn.MultiheadAttention.from_torch(
            torch.nn.MultiheadAttention(24, 4, dropout=0.1), mechanism="performer"
        )
    assert [w.filename for w in record] == [__file__]
