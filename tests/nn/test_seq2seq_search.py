"""Greedy decoding and beam search of ``kattn.nn.Seq2Seq``: beam size 1 is greedy, wider beams
score at least as well, a beam wide enough is exact, limits, padding and batch independence."""

from __future__ import annotations

import itertools

import pytest
import torch

from kattn.nn.seq2seq import Seq2Seq
from kattn.nn.seq2seq_search import beam_search, greedy_decode

BOS, EOS = 0, 1


def _model(vocab: int = 12, decoder: str = "performer", seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(
        vocab, vocab, dim=16, num_heads=2, ffn_dim=32, num_encoder_layers=1,
        num_decoder_layers=2, decoder_attention=decoder, cross_attention="performer",
        max_len=64, dropout=0.0, embedding_std=1.0,
    ).eval()  # fmt: skip


def _sources(vocab: int = 12, seed: int = 1):
    src = torch.randint(2, vocab, (4, 8), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(4, 8, dtype=torch.bool)
    mask[1, 5:] = True
    mask[3, 7:] = True
    return src, mask


def _score(model: Seq2Seq, src, mask, hypothesis: list[int], alpha: float) -> float:
    """The score of a hypothesis by the teacher-forced forward."""
    tgt_in = torch.tensor([[BOS, *hypothesis]])
    target = torch.tensor([*hypothesis, EOS])
    with torch.no_grad():
        lp = torch.log_softmax(model(src, tgt_in, mask)[0].double(), dim=-1)
    return float(lp[torch.arange(len(target)), target].sum()) / len(target) ** alpha


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("decoder", ["performer", "softmax", "gaussian"])
def test_beam_size_one_is_greedy(decoder, alpha):
    model = _model(decoder=decoder)
    src, mask = _sources()
    limits = {"max_len_a": 1.0, "max_len_b": 2, "length_penalty": alpha}
    greedy, g_scores = greedy_decode(model, src, mask, bos=BOS, eos=EOS, **limits)
    beam, b_scores = beam_search(model, src, mask, bos=BOS, eos=EOS, beam_size=1, **limits)
    assert beam == greedy
    torch.testing.assert_close(b_scores, g_scores, rtol=1e-12, atol=1e-12)
    for i, hypothesis in enumerate(greedy):
        assert EOS not in hypothesis and len(hypothesis) <= int((~mask[i]).sum()) + 2
        expected = _score(model, src[i : i + 1], mask[i : i + 1], hypothesis, alpha)
        assert abs(float(g_scores[i]) - expected) < 1e-4


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wider_beams_never_score_below_greedy(alpha):
    gains = []
    for seed in range(6):
        model = _model(vocab=6, seed=seed)
        src, mask = _sources(vocab=6, seed=seed)
        limits = {"max_len_a": 0.5, "max_len_b": 3, "length_penalty": alpha}
        _, greedy = greedy_decode(model, src, mask, bos=BOS, eos=EOS, **limits)
        _, beam = beam_search(model, src, mask, bos=BOS, eos=EOS, beam_size=4, **limits)
        gains.append(beam - greedy)
    gain = torch.cat(gains)
    assert bool((gain >= -1e-9).all())
    assert bool((gain > 1e-6).any())  # the test can tell a beam from greedy


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_wider_than_all_hypotheses_finds_the_best_one(alpha):
    model = _model(vocab=4, seed=3)  # tokens 2, 3 besides bos and eos
    src, mask = _sources(vocab=4, seed=3)
    src, mask = src[:2], mask[:2]
    best, scores = beam_search(
        model, src, mask, bos=BOS, eos=EOS, beam_size=64, length_penalty=alpha, max_len_b=3
    )
    for i in range(2):
        everything = [
            list(h) for n in range(4) for h in itertools.product([BOS, 2, 3], repeat=n)
        ]  # the 40 hypotheses of at most 3 tokens
        exact = [_score(model, src[i : i + 1], mask[i : i + 1], h, alpha) for h in everything]
        top = max(range(len(exact)), key=exact.__getitem__)
        assert best[i] == everything[top]
        assert abs(float(scores[i]) - exact[top]) < 1e-4


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_sentence_decodes_the_same_alone_and_in_a_batch(search):
    model = _model()
    src, mask = _sources()

    def run(s, m):
        if search == "greedy":
            return greedy_decode(model, s, m, bos=BOS, eos=EOS, max_len_a=1.0, max_len_b=2)
        return beam_search(model, s, m, bos=BOS, eos=EOS, beam_size=3, max_len_a=1.0, max_len_b=2)

    together, scores = run(src, mask)
    for i in range(4):
        real = int((~mask[i]).sum())
        alone, score = run(src[i : i + 1, :real], None)
        assert alone[0] == together[i]
        torch.testing.assert_close(score[0], scores[i], rtol=1e-5, atol=1e-5)


def test_limits_bound_the_lengths_and_bad_options_are_refused():
    model = _model()
    src, mask = _sources()
    out, _ = beam_search(model, src, mask, bos=BOS, eos=EOS, beam_size=2, max_len_b=0)
    assert out == [[], [], [], []]
    out, _ = greedy_decode(model, src, mask, bos=BOS, eos=EOS, max_len_a=0.5, max_len_b=1)
    assert all(len(h) <= int(0.5 * int((~mask[i]).sum())) + 1 for i, h in enumerate(out))
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, bos=BOS, eos=EOS, beam_size=0)
    with pytest.raises(ValueError, match="max_len_a"):
        greedy_decode(model, src, mask, bos=BOS, eos=EOS, max_len_a=-1.0)
    model.train()
    greedy_decode(model, src, mask, bos=BOS, eos=EOS, max_len_b=2)
    assert model.training  # the mode is restored


def test_decoding_stops_at_the_positions_the_decoder_can_read() -> None:
    """A decoder whose relative encoding has max_len offsets emits at most max_len − 1 tokens
    before eos, whatever max_len_a and max_len_b allow (it raised past the table before)."""
    torch.manual_seed(0)
    model = Seq2Seq(
        50, 50, dim=16, num_heads=2, ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1,
        encoder_attention="nprf_rpe", decoder_attention="nprf_rpe",
        cross_attention="performer", max_len=16,
    ).eval()  # fmt: skip
    assert model.max_target_tokens == 15
    src = torch.randint(4, 50, (1, 15))
    for search, extra in ((greedy_decode, {}), (beam_search, {"beam_size": 2})):
        tokens, _ = search(model, src, None, bos=1, eos=2, max_len_a=1.2, max_len_b=10, **extra)
        assert len(tokens[0]) <= 15
    unbounded = Seq2Seq(50, 50, dim=16, num_heads=2, ffn_dim=32, max_len=16)
    assert unbounded.max_target_tokens is None
