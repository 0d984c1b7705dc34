"""Sampling from a causal language model: temperature, top-k and nucleus (top-p) sampling, with
recurrent decoding where the mechanism allows it.

Strategies of :func:`generate`:

* ``"recurrent"`` — the prompt is read once in parallel form (:meth:`CausalLM.prefill`), then
  each new token is one :meth:`CausalLM.step`: constant time and memory per token for
  kernelized mechanisms, a growing key/value cache for ``softmax``.
* ``"reencode"`` — every new token runs the causal forward over the whole sequence so far
  (O(L) per token for linear mechanisms, O(L²) for quadratic ones): the fallback for
  mechanisms without a recurrent form.
* ``"auto"`` (default) — recurrent when every layer supports it, else re-encoding with a
  warning.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..checks import int_at_least, positive_int_or_none
from .encoder import check_token_ids

if TYPE_CHECKING:
    from .causal_lm import CausalLM

STRATEGIES = ("auto", "recurrent", "reencode")


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ``ValueError`` for sampling options out of range."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    positive_int_or_none("top_k", top_k)
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one id per row of ``logits (B, V)``: ``temperature`` 0 is greedy (argmax); else
    the softmax of ``logits / temperature`` restricted to the ``top_k`` largest and to the
    smallest set whose probability reaches ``top_p`` (the nucleus). Returns ``(B,)`` int64."""
    check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, index = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        drop = before >= top_p  # the most likely token always stays (before = 0)
        ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, index, ordered)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def generate(
    model: CausalLM,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    strategy: str = "auto",
) -> Tensor:
    """``prompt`` ((B, L) or (L,) ids, L >= 1) followed by up to ``max_new_tokens`` sampled ids.

    Args:
        temperature, top_k, top_p: see :func:`sample_next`.
        generator: the random source of the sampling (the global RNG if None).
        eos_id: stop once every sequence has produced this id (later positions of finished
            sequences repeat it).
        strategy: ``"auto"``, ``"recurrent"`` or ``"reencode"`` (see the module docstring).

    The model runs in eval mode without gradients (its mode is restored afterwards).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    int_at_least("max_new_tokens", max_new_tokens, 0)
    check_sampling(temperature, top_k, top_p)
    single = prompt.dim() == 1
    tokens = prompt[None] if single else prompt
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(
            f"prompt must be (B, L) or (L,) ids with L >= 1, got {tuple(prompt.shape)}"
        )
    tokens = tokens.to(device=model.head.weight.device, dtype=torch.int64)
    check_token_ids(tokens, model.head.weight.shape[0], on_any_device=True)
    if strategy == "auto":
        strategy = "recurrent" if model.supports_recurrent else "reencode"
        if strategy == "reencode":
            warnings.warn(
                f"mechanism {model.mechanism!r} has no recurrent form: every new token "
                "re-encodes the whole sequence (time per token grows with its length)",
                stacklevel=3,
            )
    sample: dict[str, Any] = {
        "temperature": temperature, "top_k": top_k, "top_p": top_p, "generator": generator
    }  # fmt: skip
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = _decode(model, tokens, max_new_tokens, strategy, eos_id, sample)
    finally:
        model.train(was_training)
    return out[0] if single else out


def _decode(
    model: CausalLM,
    tokens: Tensor,
    max_new_tokens: int,
    strategy: str,
    eos_id: int | None,
    sample: dict[str, Any],
) -> Tensor:
    produced: list[Tensor] = []
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    if max_new_tokens == 0:
        return tokens
    if strategy == "recurrent":
        logits, state = model.prefill(tokens)
        last = logits[:, -1]
    else:
        last = model(tokens)[:, -1]
    for i in range(max_new_tokens):
        token = sample_next(last, **sample)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done = done | (token == eos_id)
        produced.append(token)
        if i == max_new_tokens - 1 or bool(done.all()):
            break
        if strategy == "recurrent":
            last, state = model.step(token, state)
        else:
            sequence = torch.cat([tokens, torch.stack(produced, dim=1)], dim=1)
            last = model(sequence)[:, -1]
    return torch.cat([tokens, torch.stack(produced, dim=1)], dim=1)
