"""kattn.hf's cached paths hand a mechanism fewer queries than the full forward; the
mechanisms whose rows depend on the other queries or on the query's position (their flags
rows_depend_on_other_queries, rows_depend_on_position) are refused there (kattn.hf.rows):
the flags are checked against the outputs over kattn.available()."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import kattn

from ..helpers import assert_close
from .tiny_models import inputs, make, make_bart

hf = pytest.importorskip("kattn.hf")
from kattn.hf.attention import _attend_last_rows  # noqa: E402
from kattn.hf.rows import check_cross_step, check_last_rows  # noqa: E402

# options that make blocks, buckets, clusters and landmarks smaller than the 40 queries, so
# that the mechanisms that mix queries do it here
PROBES: dict[str, list[dict[str, Any]]] = {
    "bigbird": [{"block_size": 4, "num_global": 4, "num_window_blocks": 3, "num_random_blocks": 2}],
    "longformer": [{"window": 8, "block_size": 4, "num_global": 2}],
    "reformer": [{"bucket_size": 4}, {"bucket_size": 4, "shared_qk": False}],
    "sinkhorn": [{"block_size": 4}],
    "sparse_transformer": [{"stride": 4, "c": 2, "block_size": 4}],
    "local": [{"window": 8, "block_size": 4}],
    "simpletron": [{"chunk_size": 4}],
    "clustered": [{"num_clusters": 4}],
    "improved_clustered": [{"num_clusters": 4, "topk": 4}],
    "informer": [{"factor": 1}],
    "nystromformer": [{"num_landmarks": 4}],
    "skyformer": [{"num_landmarks": 4}],
    "smyrf": [{"cluster_size": 4}],
    "synthesizer": [{}, {"variant": "random"}, {"variant": "factorized_random"}],
    "softmax_rpe": [{}, {"rpe": "decay"}],
}
CASES = [(n, o) for n in kattn.available() for o in PROBES.get(n, [{}])]


def _build(name: str, options: dict[str, Any]) -> kattn.Attention:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attn = kattn.build(name, head_dim=8, num_heads=2, max_len=64, **options)
    attn = attn.double().eval()
    with torch.no_grad():  # as if trained: a zero-initialised position table is not flat
        for parameter in attn.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return attn


def _qkv(lq: int, lk: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randn(2, 2, n, 8, generator=g, dtype=torch.float64) for n in (lq, lk, lk))


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_last_rows_after_cached_keys_are_exact_or_refused(name: str, options: dict) -> None:
    attn = _build(name, options)
    if not attn.supports_causal:
        pytest.skip(f"{name} has no causal form: never on the key/value cache path")
    q, k, v = _qkv(40, 40)
    with torch.no_grad():
        full = attn(q, k, v, causal=True)[:, :, 31:]
        last = _attend_last_rows(attn, q[:, :, 31:], k, v, None)
    if attn.rows_depend_on_other_queries:
        assert (full - last).abs().max() > 1e-3  # flagged for a reason
        with pytest.raises(NotImplementedError, match="use_cache=False"):
            check_last_rows(attn)
    else:
        assert_close(last, full)
        check_last_rows(attn)


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_a_lone_cross_attention_query_is_exact_or_refused(name: str, options: dict) -> None:
    attn = _build(name, options)
    if not attn.supports_cross:
        pytest.skip(f"{name} has no cross-attention")
    q, k, v = _qkv(40, 48)
    rows = [0, 17, 39]
    with torch.no_grad():
        full = attn(q, k, v, causal=False)[:, :, rows]
        lone = torch.cat([attn(q[:, :, i : i + 1], k, v, causal=False) for i in rows], 2)
    if attn.rows_depend_on_other_queries or attn.rows_depend_on_position:
        assert (full - lone).abs().max() > 1e-3  # flagged for a reason
        with pytest.raises(NotImplementedError, match="use_cache=False"):
            check_cross_step(attn, 17)
    else:
        assert_close(lone, full)
        check_cross_step(attn, 17)


def _causal_key_value_cache_mechanisms() -> list[str]:
    names = []
    for name in kattn.available():
        attn = _build(name, {})
        if attn.supports_causal and not attn.supports_recurrent:
            names.append(name)
    return names


@pytest.mark.parametrize("mechanism", _causal_key_value_cache_mechanisms())
def test_cached_logits_equal_the_full_forward_or_are_refused(mechanism: str) -> None:
    """Llama through a DynamicCache (prompt of 8, then one token at a time)."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf.use(make("llama").double(), mechanism)
    ids = inputs("llama", batch=1, length=16)["input_ids"]
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        first = model(ids[:, :8], cache=cache).logits
        if hf.attention_modules(model)[0].kattn.rows_depend_on_other_queries:
            with pytest.raises(NotImplementedError, match="use_cache=False"):
                model(ids[:, 8:9], cache=cache)
            return
        steps = [first] + [model(ids[:, t : t + 1], cache=cache).logits for t in range(8, 16)]
    assert_close(torch.cat(steps, dim=1), full)


def _bart_steps(model: Any, ids: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
    from transformers import DynamicCache, EncoderDecoderCache

    enc = model.get_encoder()(input_ids=ids)
    cache = EncoderDecoderCache(
        DynamicCache(config=model.config), DynamicCache(config=model.config)
    )
    kwargs = {"encoder_outputs": enc, "cache": cache, "use_cache": True}
    outs = [model(decoder_input_ids=dec[:, :3], **kwargs).logits]
    outs += [model(decoder_input_ids=dec[:, i : i + 1], **kwargs).logits for i in range(3, 6)]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("mechanism", ["performer", "nprf_rpe"])
def test_bart_cross_attention_steps(mechanism: str) -> None:
    """Performer's cached steps equal the full forward; nprf_rpe's decay encoding numbers the
    lone cross-attention query from 0, so its cached steps are refused (the full forward,
    use_cache=True included, still runs)."""
    model = make_bart().double()
    hf.use(
        model, mechanism, num_features=16, **({"rpe": "decay"} if mechanism == "nprf_rpe" else {})
    )
    g = torch.Generator().manual_seed(2)
    ids, dec = (
        torch.randint(3, 100, (2, 10), generator=g),
        torch.randint(3, 100, (2, 6), generator=g),
    )
    with torch.no_grad():
        full = model(input_ids=ids, decoder_input_ids=dec).logits
        if mechanism == "nprf_rpe":
            # the first call (three queries from position 0) runs; the first step is refused
            with pytest.raises(NotImplementedError, match=r"at position 3\)"):
                _bart_steps(model, ids, dec)
            return
        assert_close(_bart_steps(model, ids, dec), full)


def test_reformer_generation_is_refused_with_the_advice_and_runs_without_a_cache() -> None:
    model = hf.use(make("llama").double(), "reformer", bucket_size=4)
    prompt = inputs("llama", batch=1, length=8)["input_ids"]
    kwargs = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    with pytest.raises(NotImplementedError, match="use_cache=False"):
        model.generate(prompt, **kwargs)
    assert model.generate(prompt, use_cache=False, **kwargs).shape == (1, 11)
