"""``kattn.nn.CausalLM``: causal logits, recurrent decoding with the parallel forward's logits,
and generation (sampling, strategies, limits)."""

from __future__ import annotations

import pytest
import torch

import kattn
from kattn.nn import CausalLM, generate, sample_next

VOCAB = 40


def _lm(mechanism: str = "performer", **options) -> CausalLM:
    torch.manual_seed(0)
    shape = {"dim": 32, "depth": 2, "num_heads": 2, "ffn_dim": 64, "dropout": 0.0}
    return CausalLM(VOCAB, 64, mechanism=mechanism, **{**shape, **options}).eval()


#: every causal mechanism with a recurrent form, and nprf_rpe with its constant-time encoding
RECURRENT = [
    (name, {})
    for name in kattn.available()
    if kattn.spec(name).supports_causal and kattn.spec(name).supports_recurrent
] + [("nprf_rpe", {"rpe": "decay"})]


@pytest.mark.parametrize(("name", "options"), RECURRENT, ids=[f"{n}{o}" for n, o in RECURRENT])
def test_step_by_step_logits_equal_the_parallel_forward(name, options):
    model = _lm(name, **options)
    tokens = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens)
        logits, state = model.prefill(tokens[:, :12])  # the prompt, in parallel form
        rows = [logits]
        for t in range(12, 33):
            step, state = model.step(tokens[:, t], state)
            rows.append(step[:, None])
        from_scratch = [model.prefill(tokens[:, :1])]
        state = from_scratch[0][1]
        for t in range(1, 33):
            step, state = model.step(tokens[:, t], state)
            from_scratch.append((step[:, None], state))
    torch.testing.assert_close(torch.cat(rows, dim=1), expected, rtol=1e-4, atol=1e-4)
    scratch = torch.cat([x for x, _ in from_scratch], dim=1)
    torch.testing.assert_close(scratch, expected, rtol=1e-4, atol=1e-4)
    assert state.position == 33


@pytest.mark.parametrize("name", ["softmax", "performer", "gaussian", "simpletron"])
def test_logits_never_see_the_future(name):
    model = _lm(name)
    tokens = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_embeddings_are_tied_by_default_and_gradients_flow():
    model = _lm("performer").train()
    assert model.head.weight is model.embedding.weight
    untied = _lm("performer", tie_embeddings=False)
    assert untied.head.weight is not untied.embedding.weight
    assert model.tie_embeddings is True and untied.tie_embeddings is False
    tokens = torch.randint(0, VOCAB, (2, 16))
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_mechanism_without_causal_form_is_refused():
    with pytest.raises(ValueError, match="no causal form"):
        _lm("skyformer")


def test_learned_positions_bound_the_length_and_sinusoidal_ones_do_not():
    model = _lm("performer")
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    _, state = model.prefill(torch.zeros(1, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="beyond max_len"):
        model.step(torch.zeros(1, dtype=torch.long), state)
    free = _lm("performer", positions="sinusoidal")
    out = free.generate(torch.zeros(1, 60, dtype=torch.long), 10, temperature=0)
    assert out.shape == (1, 70)


def test_greedy_generation_is_the_same_by_recurrence_and_by_reencoding():
    model = _lm("performer").double()
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    fast = model.generate(prompt, 12, temperature=0, strategy="recurrent")
    slow = model.generate(prompt, 12, temperature=0, strategy="reencode")
    assert fast.shape == (2, 19) and torch.equal(fast[:, :7], prompt)
    assert torch.equal(fast, slow)


def test_sampling_is_reproducible_with_a_generator_and_restores_the_mode():
    model = _lm("softmax").train()
    prompt = torch.tensor([1, 2, 3])
    runs = [
        model.generate(prompt, 8, top_k=5, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert runs[0].shape == (11,) and torch.equal(runs[0], runs[1])
    assert model.training


def test_a_mechanism_without_recurrence_reencodes_with_a_warning():
    model = _lm("gaussian")
    assert not model.supports_recurrent
    with pytest.warns(UserWarning, match="re-encodes"):
        out = generate(model, torch.tensor([[1, 2]]), 3, temperature=0)
    assert out.shape == (1, 5)
    with pytest.raises(NotImplementedError, match="no recurrent form"):
        model.prefill(torch.tensor([[1, 2]]))


def test_generation_stops_at_eos():
    model = _lm("performer")
    first = int(model.generate(torch.tensor([[4]]), 1, temperature=0)[0, 1])
    out = model.generate(torch.tensor([[4]]), 10, temperature=0, eos_id=first)
    assert out.tolist() == [[4, first]]


def test_top_k_and_top_p_keep_only_the_likely_tokens():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]]).expand(400, -1)
    g = torch.Generator().manual_seed(0)
    drawn = sample_next(logits, top_k=2, generator=g)
    assert set(drawn.tolist()) == {1, 2}
    # p(1) ≈ 0.47, p(2) ≈ 0.43: a nucleus of 0.5 needs both, one of 0.4 only the first
    assert set(sample_next(logits, top_p=0.5, generator=g).tolist()) == {1, 2}
    assert set(sample_next(logits, top_p=0.4, generator=g).tolist()) == {1}
    assert sample_next(logits[:1], temperature=0).tolist() == [1]
    assert set(sample_next(logits, generator=g).tolist()) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"strategy": "beam"}, "strategy"),
    ],
)
def test_bad_generation_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        _lm("performer").generate(torch.tensor([1]), 2, **options)


@pytest.mark.parametrize("bad", [-1, VOCAB], ids=["negative", "vocab_size"])
def test_token_ids_outside_the_vocabulary_are_refused(bad):
    model = _lm()
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    tokens[1, 3] = bad
    message = rf"token ids must be in \[0, vocab_size\) = \[0, {VOCAB}\).*{bad}"
    with pytest.raises(ValueError, match=message):
        model(tokens)
    with pytest.raises(ValueError, match=message):
        model.prefill(tokens)
    _, state = model.prefill(tokens[:, :3])
    with pytest.raises(ValueError, match=message):
        model.step(tokens[:, 3], state)
    for strategy in ("recurrent", "reencode"):
        with pytest.raises(ValueError, match=message):
            model.generate(tokens, 2, strategy=strategy)


def test_token_ids_on_an_accelerator_are_checked_only_where_asked():
    """No device-to-host read per forward off the CPU (a meta tensor has no values to read:
    reading one would raise); a prompt is checked on any device, once per generation."""
    from kattn.nn.encoder import check_token_ids

    check_token_ids(torch.empty(2, 5, dtype=torch.int64, device="meta"), VOCAB)
    with pytest.raises(Exception, match="meta"):
        check_token_ids(
            torch.empty(2, 5, dtype=torch.int64, device="meta"), VOCAB, on_any_device=True
        )
