"""What kattn.patch says about the attention-like modules it could not replace."""

import sys

import pytest
import torch
from torch import nn

import kattn


class HomeMadeAttention(nn.Module):
    """An attention kattn.patch cannot know: its own projections and call."""

    def __init__(self, dim=24):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


class Block(nn.Module):
    def __init__(self, *, torch_attention):
        super().__init__()
        self.mixer = HomeMadeAttention()
        self.mha = nn.MultiheadAttention(24, 4, batch_first=True) if torch_attention else None


def test_nothing_to_replace_raises_listing_what_was_seen():
    torch.manual_seed(0)
    model = nn.Sequential(Block(torch_attention=False), Block(torch_attention=False))
    with pytest.raises(ValueError, match=r"no torch\.nn\.MultiheadAttention") as info:
        kattn.patch(model, mechanism="performer")
    message = str(info.value)
    assert "0.mixer and 1 more (HomeMadeAttention)" in message
    assert "does not know how this module projects" in message


def test_a_model_without_anything_attention_like_says_so():
    with pytest.raises(ValueError, match="no module whose class name says attention"):
        kattn.patch(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), mechanism="performer")


def test_what_was_left_beside_what_was_replaced_is_a_warning():
    torch.manual_seed(0)
    model = Block(torch_attention=True)
    with pytest.warns(UserWarning, match=r"left these .*\n  - mixer \(HomeMadeAttention\)") as rec:
        kattn.patch(model, mechanism="softmax")
    assert isinstance(model.mha, kattn.MultiheadAttention)
    assert [w.filename for w in rec] == [__file__]


def test_a_model_already_on_kattn_points_at_convert_attention():
    torch.manual_seed(0)
    model = nn.Sequential(kattn.MultiheadAttention(24, 4, mechanism="softmax"))
    with pytest.raises(ValueError, match=r"kattn\.convert_attention"):
        kattn.patch(model, mechanism="performer")


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32)  # fmt: skip
    return transformers.BertModel(config)


def test_a_hugging_face_model_without_the_attention_interface_is_reported():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BloomConfig(vocab_size=50, hidden_size=16, n_layer=2, n_head=2)
    model = nn.ModuleDict({"lm": transformers.BloomModel(config)})
    with pytest.raises(ValueError) as info:
        kattn.patch(model, mechanism="performer")
    message = str(info.value)
    assert "lm.h.0.self_attention and 1 more (BloomAttention)" in message
    assert "inside lm (BloomModel)" in message
    assert "instead of calling transformers' attention interface" in message


def test_a_hugging_face_model_without_kattn_hf_says_so(monkeypatch):
    model = tiny_bert()
    monkeypatch.setitem(sys.modules, "kattn.hf", None)  # as if kattn.hf were missing
    with pytest.raises(ValueError) as info:
        kattn.patch(model, mechanism="performer")
    message = str(info.value)
    assert "encoder.layer.0.attention.self and 1 more (BertSelfAttention)" in message
    assert "kattn.hf is not available" in message
