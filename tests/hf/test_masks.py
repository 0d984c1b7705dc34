"""Masks of transformers as kattn's key padding, and what kattn.hf refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from .tiny_models import inputs, make, make_llama4

hf = pytest.importorskip("kattn.hf")


def test_padding_mask_forms() -> None:
    keep = torch.tensor([[True, True, False], [True, True, True]])
    compact = keep[:, None, None, :]
    expected = torch.tensor([[False, False, True], [False, False, False]])
    assert torch.equal(hf.key_padding_mask(compact, batch=2, lq=3, lk=3, causal=False), expected)
    additive = torch.where(compact, 0.0, torch.finfo(torch.float32).min)
    assert torch.equal(hf.key_padding_mask(additive, batch=2, lq=3, lk=3, causal=True), expected)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None, None] & compact
    assert torch.equal(hf.key_padding_mask(causal, batch=2, lq=3, lk=3, causal=True), expected)
    assert hf.key_padding_mask(None, batch=2, lq=3, lk=3, causal=True) is None
    # the last keys of a longer mask: those a recurrent state has read are not passed again
    left = torch.tensor([[False, True, True], [True, True, True]])[:, None, None, :]
    assert hf.key_padding_mask(left, batch=2, lq=2, lk=2, causal=True) is None
    assert torch.equal(
        hf.key_padding_mask(compact, batch=2, lq=1, lk=1, causal=True), expected[:, -1:]
    )


def test_masks_that_are_not_causal_plus_padding_are_refused() -> None:
    window = torch.ones(4, 4, dtype=torch.bool).tril() & torch.ones(4, 4, dtype=torch.bool).triu(-1)
    with pytest.raises(NotImplementedError, match="not causal attention with padded keys"):
        hf.key_padding_mask(window[None, None], batch=1, lq=4, lk=4, causal=True)
    bias = torch.zeros(1, 1, 4, 4)
    bias[..., 0] = -1.0
    with pytest.raises(NotImplementedError, match="additive biases"):
        hf.key_padding_mask(bias, batch=1, lq=4, lk=4, causal=False)


def test_a_custom_4d_mask_reaches_the_check() -> None:
    model = hf.use(make("llama"), "performer")
    ids = inputs("llama", batch=1, length=6)["input_ids"]
    block = torch.ones(1, 1, 6, 6, dtype=torch.bool)  # bidirectional in a causal model
    with pytest.raises(NotImplementedError, match="not causal attention"):
        model(ids, attention_mask=block)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    assert torch.equal(model(ids, attention_mask=causal).logits, model(ids).logits)


def test_a_short_sliding_window_is_refused() -> None:
    model = hf.use(make("mistral", sliding_window=4), "performer")
    with pytest.raises(NotImplementedError, match="sliding"):
        model(**inputs("mistral", length=8))


def test_every_mechanism_is_an_implementation() -> None:
    from transformers import AttentionInterface

    import kattn

    names = set(AttentionInterface().valid_keys())
    assert {f"kattn:{n}" for n in kattn.available()} <= names
    with pytest.raises(ValueError, match="mechanism must be one of"):
        hf.use(make("llama"), "no_such_mechanism")


def test_import_without_transformers_names_the_extra() -> None:
    code = "import sys; sys.modules['transformers'] = None; import kattn.hf"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "pip install kattn[hf]" in result.stderr


def test_a_sliding_window_that_covers_the_call_gives_only_the_padding() -> None:
    """Mistral's default window (4096) over 12 positions: no Lq x Lk mask is built."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[0, :3] = False
    window = {"mask_function": sliding_window_causal_mask_function(4096), "local_size": 4096}
    args = {"batch_size": 2, "q_length": 12, "kv_length": 12, "attention_mask": keep}
    got = hf.kattn_mask(**args, **window, allow_is_causal_skip=True)
    assert got is not None and got.shape == (2, 1, 1, 12)
    assert torch.equal(got[:, 0, 0], keep)
    # an overlay laid over the window (transformers then allows no skip) or a window
    # shorter than the positions: the full pattern, which key_padding_mask checks
    assert hf.kattn_mask(**args, **window, allow_is_causal_skip=False).shape == (2, 1, 12, 12)
    short = {"mask_function": sliding_window_causal_mask_function(8), "local_size": 8}
    assert hf.kattn_mask(**args, **short, allow_is_causal_skip=True).shape == (2, 1, 12, 12)
    decoding = {**args, "q_length": 1, "q_offset": 11}  # one step after 11 cached keys
    assert hf.kattn_mask(**decoding, **window, allow_is_causal_skip=True).shape == (2, 1, 1, 12)


def test_chunks_are_the_plain_pattern_only_within_the_first_chunk() -> None:
    """Chunked attention (Llama 4) reaches the mask function as ``local_size`` too, and its
    cache layer drops keys as a sliding window's does (kv_offset > 0); but eight positions
    from 2 to 9 cross the boundary of chunks of 8."""
    from types import SimpleNamespace

    from transformers.masking_utils import chunked_causal_mask_function, sdpa_mask

    args = {
        "batch_size": 1,
        "q_length": 1,
        "kv_length": 8,
        "q_offset": 9,
        "kv_offset": 2,
        "attention_mask": None,
        "mask_function": chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long)),
        "local_size": 8,
    }
    config = SimpleNamespace(attention_chunk_size=8)
    got = hf.kattn_mask(**args, allow_is_causal_skip=True, config=config)
    expected = sdpa_mask(**args, allow_is_causal_skip=False)
    assert got is not None and torch.equal(got, expected)
    assert not bool(got.all())
    first = {**args, "q_offset": 7, "kv_offset": 0}  # every position in the first chunk
    assert hf.kattn_mask(**first, allow_is_causal_skip=True, config=config) is None
    # the same positions under a sliding window of 8 are the plain pattern
    from transformers.masking_utils import sliding_window_causal_mask_function

    window = {**args, "mask_function": sliding_window_causal_mask_function(8)}
    sliding = SimpleNamespace(sliding_window=8, attention_chunk_size=None)
    assert hf.kattn_mask(**window, allow_is_causal_skip=True, config=sliding) is None


def test_llama4_chunked_decoding_equals_eager_or_is_refused() -> None:
    """Chunks of 4: a forward longer than a chunk attends within each chunk, whose block-
    diagonal mask is that of packed documents; a key/value cache decodes one token at a time
    across chunk boundaries as eager does; a recurrent state, which cannot drop the keys of a
    finished chunk, is refused."""
    from transformers import DynamicCache

    model = make_llama4(chunk=4)
    ids = inputs("llama", batch=1, length=10)["input_ids"]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
    hf.use(model, "softmax")
    with torch.no_grad():
        chunked = model(ids, use_cache=False).logits
    torch.testing.assert_close(chunked, eager, rtol=1e-9, atol=1e-9)
    # in training a forward keeps transformers' key/value cache (dropout is 0 here)
    model.train()
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        steps = [model(ids[:, :3], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(3, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), eager, rtol=1e-9, atol=1e-9)
    model.eval()  # a recurrent state
    with torch.no_grad(), pytest.raises(NotImplementedError, match="attention chunk"):
        cache = DynamicCache(config=model.config)
        for t in range(10):
            model(ids[:, t : t + 1], cache=cache)


def test_mistral_with_its_default_window_gets_only_the_padding(monkeypatch) -> None:
    """In the model, the default window (4096) over 12 positions hands the attention
    function the (B, 1, 1, Lk) padding, not an Lq x Lk mask, and the outputs are those
    without a window."""
    from kattn.hf import attention

    shapes = []

    def spy(mask, **kwargs):
        shapes.append(None if mask is None else tuple(mask.shape))
        return hf.key_padding_mask(mask, **kwargs)

    monkeypatch.setattr(attention, "key_padding_mask", spy)
    batch = inputs("mistral")
    mask = torch.ones_like(batch["input_ids"])
    mask[0, :4] = 0
    outs = []
    for window in (None, 4096):
        shapes.clear()
        model = hf.use(make("mistral", sliding_window=window).double(), "performer")
        with torch.no_grad():
            outs.append(model(**batch, attention_mask=mask).logits)
        assert shapes == [(2, 1, 1, 12)] * 2  # one call per layer
    real = mask.bool()
    assert torch.equal(outs[0][real], outs[1][real])
