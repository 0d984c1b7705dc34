"""Greedy decoding and beam search for :class:`~kattn.nn.seq2seq.Seq2Seq`.

Both encode the sources once, then read one target token per step with
:meth:`~kattn.nn.seq2seq.Seq2Seq.decode_step`. A sentence of ``n`` source tokens (padding not
counted) gets at most ``⌊max_len_a·n + max_len_b⌋`` target tokens before its end-of-sentence
token, which is forced at that step — fewer when the model reads positions only up to its
``max_len`` (:attr:`~kattn.nn.seq2seq.Seq2Seq.max_target_tokens`). A hypothesis of raw
score s (the sum of the log-probabilities of its tokens, eos included) and T tokens (eos
included) scores ``s / T^α`` with α the ``length_penalty``, as fairseq's sequence generator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int

if TYPE_CHECKING:
    from .seq2seq import Seq2Seq, Seq2SeqState


def _limits(
    src: Tensor, src_padding_mask: Tensor | None, a: float, b: int, cap: int | None = None
) -> list[int]:
    """Each sentence's largest number of target tokens before eos (at most ``cap``)."""
    lengths = torch.full((src.shape[0],), src.shape[1], device=src.device)
    if src_padding_mask is not None:
        lengths = (~src_padding_mask).sum(dim=1)
    if a < 0:
        raise ValueError(f"max_len_a must be >= 0, got {a!r}")
    int_at_least("max_len_b", b, 0)
    limits = [int(a * n + b) for n in lengths.tolist()]
    return limits if cap is None else [min(n, cap) for n in limits]


def _start(model: Seq2Seq, src: Tensor, src_padding_mask: Tensor | None, rows: int) -> Seq2SeqState:
    """The decoding state of every source repeated ``rows`` times (consecutive rows)."""
    state = model.init_decoding(model.encode(src, src_padding_mask), src_padding_mask)
    if rows == 1:
        return state
    index = torch.arange(src.shape[0], device=src.device).repeat_interleave(rows)
    return state.select(index)


def _log_probs(logits: Tensor, step: int, limits: list[int], eos: int, rows: int) -> Tensor:
    """Log-softmax of ``logits (N, V)``, with only eos allowed on the rows whose sentence
    reached its limit at this step."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    forced = torch.tensor([n == step for n in limits], device=lp.device)
    if bool(forced.any()):
        only_eos = torch.full_like(lp, float("-inf"))
        only_eos[:, eos] = lp[:, eos]
        lp = torch.where(forced.repeat_interleave(rows)[:, None], only_eos, lp)
    return lp


@torch.no_grad()
def greedy_decode(
    model: Seq2Seq,
    src: Tensor,
    src_padding_mask: Tensor | None = None,
    *,
    bos: int,
    eos: int,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    length_penalty: float = 1.0,
) -> tuple[list[list[int]], Tensor]:
    """The most likely next token at every step, for each source of ``src (B, Ls)``.

    Returns the token lists (without bos and eos) and their scores ``(B,)`` (see the module
    docstring). The model runs in eval mode (its mode is restored afterwards).
    """
    limits = _limits(src, src_padding_mask, max_len_a, max_len_b, model.max_target_tokens)
    was_training = model.training
    model.eval()
    try:
        state = _start(model, src, src_padding_mask, 1)
        batch = src.shape[0]
        token = torch.full((batch,), bos, dtype=torch.int64, device=src.device)
        raw = torch.zeros(batch, dtype=torch.float64)
        out: list[list[int]] = [[] for _ in range(batch)]
        done = [False] * batch
        for step in range(max(limits) + 1):
            logits, state = model.decode_step(token, state)
            lp = _log_probs(logits, step, limits, eos, 1)
            token = lp.argmax(dim=-1)
            best = lp.gather(1, token[:, None])[:, 0].double().cpu()
            for i, t in enumerate(token.tolist()):
                if done[i]:
                    continue
                raw[i] += best[i]
                done[i] = t == eos
                if not done[i]:
                    out[i].append(t)
            if all(done):
                break
    finally:
        model.train(was_training)
    lengths = torch.tensor([len(o) + 1 for o in out], dtype=torch.float64)
    return out, raw / lengths**length_penalty


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_padding_mask: Tensor | None = None,
    *,
    bos: int,
    eos: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
) -> tuple[list[list[int]], Tensor]:
    """Beam search over the sources of ``src (B, Ls)``, the beams of all sentences flattened
    into one batch of ``B · beam_size`` rows.

    Each step extends every live beam by every token and keeps, per sentence, the
    ``beam_size`` best extensions that do not end the sentence; the extensions that end it
    (eos) among the ``beam_size`` best become finished hypotheses. A sentence is done once no
    live beam can reach a better score than its best finished hypothesis (log-probabilities
    are at most 0, so a live beam's score is bounded by its raw score over the longest
    length it may reach when α >= 0, the next length when α < 0), or, as fairseq, once it has
    ``beam_size`` finished hypotheses.

    Returns the best hypothesis of each sentence (tokens without bos and eos) and its score,
    ``(B,)``. The model runs in eval mode (its mode is restored afterwards).
    """
    positive_int("beam_size", beam_size)
    limits = _limits(src, src_padding_mask, max_len_a, max_len_b, model.max_target_tokens)
    was_training = model.training
    model.eval()
    try:
        return _beam(model, src, src_padding_mask, bos, eos, beam_size, length_penalty, limits)
    finally:
        model.train(was_training)


def _beam(
    model: Seq2Seq,
    src: Tensor,
    src_padding_mask: Tensor | None,
    bos: int,
    eos: int,
    k: int,
    alpha: float,
    limits: list[int],
) -> tuple[list[list[int]], Tensor]:
    batch, device = src.shape[0], src.device
    state = _start(model, src, src_padding_mask, k)
    token = torch.full((batch * k,), bos, dtype=torch.int64, device=device)
    history = torch.zeros(batch * k, 0, dtype=torch.int64)
    scores = torch.full((batch, k), float("-inf"), dtype=torch.float64)
    scores[:, 0] = 0.0  # one live beam at first: the others would repeat it
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for step in range(max(limits) + 1):
        logits, state = model.decode_step(token, state)
        lp = _log_probs(logits, step, limits, eos, k).double().cpu()  # (B·k, V)
        vocab = lp.shape[-1]
        candidates = (scores[:, :, None] + lp.view(batch, k, vocab)).view(batch, k * vocab)
        top, index = candidates.topk(min(2 * k, k * vocab), dim=1)  # (B, 2k)
        rows = torch.arange(batch * k)  # done sentences keep their rows as they are
        next_token = torch.full((batch * k,), eos, dtype=torch.int64)
        for b in range(batch):
            if done[b]:
                continue
            live = 0
            for rank, (score, c) in enumerate(zip(top[b].tolist(), index[b].tolist(), strict=True)):
                if score == float("-inf"):
                    break
                row, t = b * k + c // vocab, c % vocab
                if t == eos:
                    if rank < k:
                        hypothesis = history[row].tolist()
                        finished[b].append((score / (step + 1) ** alpha, hypothesis))
                    continue
                if live < k:
                    rows[b * k + live], next_token[b * k + live] = row, t
                    scores[b, live] = score
                    live += 1
            scores[b, live:] = float("-inf")
            done[b] = _finished(finished[b], scores[b], step, limits[b], k, alpha)
        if all(done):
            break
        history = torch.cat([history[rows], next_token[:, None]], dim=1)
        state = state.select(rows.to(device), same_source=True)
        token = next_token.to(device)
    best = [max(f, key=lambda h: h[0]) for f in finished]
    return [h for _, h in best], torch.tensor([s for s, _ in best], dtype=torch.float64)


def _finished(
    hypotheses: list[tuple[float, list[int]]],
    live: Tensor,
    step: int,
    limit: int,
    k: int,
    alpha: float,
) -> bool:
    """Whether a sentence can stop: ``k`` finished hypotheses, or no live beam
    (raw scores ``live (k,)``, ``step + 1`` tokens) able to beat the best finished one."""
    best_live = float(live.max())
    if not hypotheses:  # (the step at the limit forces eos, so there is one by then)
        return False
    if len(hypotheses) >= k or step >= limit or best_live == float("-inf"):
        return True
    length = limit + 1 if alpha >= 0 else step + 2  # the length that flatters a score <= 0
    return max(s for s, _ in hypotheses) >= best_live / length**alpha
