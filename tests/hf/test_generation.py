"""Decoding with kattn.hf: cached greedy generation equals re-encoding, cached logits equal
the full forward, recurrent mechanisms keep a constant-size state, padded prompts decode as
unpadded ones."""

from __future__ import annotations

import pytest
import torch

from ..helpers import assert_close
from .tiny_models import inputs, make

hf = pytest.importorskip("kattn.hf")

DECODERS = ("gpt2", "llama")
MECHANISMS = {
    "softmax": {},
    "performer": {"num_features": 16},
    "nprf_rpe": {"rpe": "decay", "num_features": 16},
    "gaussian": {},  # no recurrent form: HF's key/value cache, queries after cached keys
}


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_cached_greedy_equals_reencoding(family: str, mechanism: str) -> None:
    model = hf.use(make(family).double(), mechanism, **MECHANISMS[mechanism])
    prompt = inputs(family, batch=1, length=6)["input_ids"]
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    cached = model.generate(prompt, **kwargs)
    reencoded = model.generate(prompt, use_cache=False, **kwargs)
    assert cached.shape == (1, 14)
    assert torch.equal(cached, reencoded)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "opt"])
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_cached_logits_equal_full_forward(family: str, mechanism: str) -> None:
    """Prompt of 5 then one token at a time through the cache generate would make. GPT-NeoX
    hands its attention the cache as layer_past=; OPT scales its queries itself."""
    from transformers import DynamicCache

    model = hf.use(make(family).double(), mechanism, **MECHANISMS[mechanism])
    ids = inputs(family, batch=2, length=9)["input_ids"]
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        steps = [model(ids[:, :5], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 9)]
    layer_type = type(cache.layers[0]).__name__
    expected = "DynamicLayer" if mechanism == "gaussian" else "RecurrentLayer"
    assert layer_type == expected
    assert_close(torch.cat(steps, dim=1), full)


def test_recurrent_state_is_constant_in_size() -> None:
    from kattn.hf import RecurrentCache

    model = hf.use(make("gpt2"), "nprf_rpe", rpe="decay", num_features=16)
    ids = inputs("gpt2", batch=1, length=40)["input_ids"]
    cache = RecurrentCache()
    sizes = []
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        for t in range(4, 40):
            model(ids[:, t : t + 1], cache=cache)
            state = cache.layers[0].state
            sizes.append(sum(x.numel() for x in state if isinstance(x, torch.Tensor)))
    assert cache.get_seq_length() == 40
    assert len(set(sizes)) == 1


@pytest.mark.parametrize("mechanism", ["performer", "softmax"])
def test_left_padded_batch_decodes_as_each_prompt_alone(mechanism: str) -> None:
    model = hf.use(make("llama").double(), mechanism, **MECHANISMS[mechanism])
    ids = inputs("llama", batch=2, length=7)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # the first prompt is 4 tokens, left-padded
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    together = model.generate(ids, attention_mask=mask, **kwargs)
    first = model.generate(ids[:1, 3:], **kwargs)
    second = model.generate(ids[1:], **kwargs)
    assert torch.equal(together[0, 7:], first[0, 4:])
    assert torch.equal(together[1, 7:], second[0, 7:])


def test_beam_search_and_several_returns() -> None:
    """Beam search reorders the recurrent states, num_return_sequences repeats them."""
    model = hf.use(make("llama").double(), "performer", num_features=16)
    prompt = inputs("llama", batch=1, length=5)["input_ids"]
    kwargs = {"max_new_tokens": 5, "num_beams": 3, "num_return_sequences": 2, "pad_token_id": 0}
    cached = model.generate(prompt, do_sample=False, **kwargs)
    reencoded = model.generate(prompt, do_sample=False, use_cache=False, **kwargs)
    assert cached.shape == (2, 10)
    assert torch.equal(cached, reencoded)


def test_a_static_cache_is_refused() -> None:
    model = hf.use(make("llama"), "performer")
    prompt = inputs("llama", batch=1, length=5)["input_ids"]
    with pytest.raises(NotImplementedError, match="static"):
        model.generate(prompt, max_new_tokens=2, cache_implementation="static", pad_token_id=0)


def test_sequences_with_the_same_padding_read_the_prompt_together(monkeypatch) -> None:
    """A scoring forward of a padded batch: one prefill per padding pattern and layer (not
    one per sequence), and the logits of the real tokens those of the forward without a
    cache."""
    from kattn.hf import cache as cache_module

    model = hf.use(make("llama").double(), "performer", num_features=16)
    ids = inputs("llama", batch=4, length=9)["input_ids"]
    mask = torch.ones_like(ids)
    mask[:2, :3] = 0  # two sequences with the same left padding, two with none
    calls = []
    read = cache_module._read
    monkeypatch.setattr(cache_module, "_read", lambda *a: calls.append(a[1].shape[0]) or read(*a))
    with torch.no_grad():
        cached = model(ids, attention_mask=mask).logits
        plain = model(ids, attention_mask=mask, use_cache=False).logits
    assert calls == [2, 2, 2, 2]  # two layers, two patterns of two sequences each
    real = mask.bool()
    assert_close(cached[real], plain[real])


@pytest.mark.parametrize("mechanism", ["performer", "nprf_rpe"])
def test_left_padded_batch_steps_the_whole_batch_at_once(mechanism: str, monkeypatch) -> None:
    """After a left-padded prompt, the sequences' fixed-size states are stacked: each step
    calls the mechanism once per layer for the whole batch, and greedy generation equals
    each prompt generated alone."""
    from kattn.hf import cache as cache_module

    model = hf.use(make("llama").double(), mechanism, **MECHANISMS[mechanism])
    ids = inputs("llama", batch=3, length=7)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # prompts of 4, 6 and 7 tokens, left-padded
    mask[1, :1] = 0
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    calls: list[tuple[int, int]] = []
    read = cache_module._read
    monkeypatch.setattr(cache_module, "_read", lambda *a: calls.append(a[1].shape[::2]) or read(*a))
    together = model.generate(ids, attention_mask=mask, **kwargs)
    steps = [c for c in calls if c[1] == 1]
    assert len(calls) == 2 * 3 + 2 * 4  # two layers: three prefills, then four steps
    assert steps == [(3, 1)] * (2 * 4)  # every step reads the three sequences together
    monkeypatch.setattr(cache_module, "_read", read)
    for b, start in enumerate((3, 1, 0)):
        alone = model.generate(ids[b : b + 1, start:], **kwargs)
        assert torch.equal(together[b, 7:], alone[0, 7 - start :])


def test_key_value_caches_of_different_lengths_are_stepped_per_sequence() -> None:
    """Softmax's caches of a left-padded batch differ in length: they stay one per
    sequence; those of an unpadded batch are the batch's."""
    from kattn.hf import RecurrentCache

    model = hf.use(make("llama").double(), "softmax")
    ids = inputs("llama", batch=2, length=6)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    cache = RecurrentCache()
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    assert isinstance(cache.layers[0].state, list)
    cache = RecurrentCache()
    with torch.no_grad():
        model(ids, attention_mask=torch.ones_like(ids), cache=cache)
    assert not isinstance(cache.layers[0].state, list)


def test_a_step_of_one_sequence_reads_slices_as_the_index_tensors_would(monkeypatch) -> None:
    """Per-sequence states (key/value caches of different lengths) step one sequence at a
    time with every key kept: slices, not index tensors, with the same outputs and states."""
    import kattn
    from kattn.hf import RecurrentLayer

    torch.manual_seed(0)
    attn = kattn.build("softmax", head_dim=8, num_heads=2).double()
    g = torch.Generator().manual_seed(4)
    prompt = [torch.randn(3, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    step = [torch.randn(3, 2, 1, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, :2] = True  # the first prompt is left-padded: states of 3, 5 and 5 keys
    fast, slow = RecurrentLayer(), RecurrentLayer()
    for layer in (fast, slow):
        layer.attend(attn, *prompt, padding)
    assert isinstance(fast.state, list)
    indexed, calls = RecurrentLayer._read_rows_indexed, []
    monkeypatch.setattr(
        RecurrentLayer, "_read_rows_indexed", lambda *a: calls.append(1) or indexed(*a)
    )
    got = fast.attend(attn, *step, None)
    assert not calls
    expected = torch.zeros_like(got)
    for b in range(3):
        slow._read_rows_indexed(attn, *step, expected, [b], [0])
    assert torch.equal(got, expected)
    for a, b in zip(fast.state, slow.state, strict=True):  # past length: unwritten capacity
        assert a.length == b.length
        assert torch.equal(a.keys[:, :, : a.length], b.keys[:, :, : b.length])
        assert torch.equal(a.values[:, :, : a.length], b.values[:, :, : b.length])
