"""Scoring a Hugging Face model before and after its attention is converted: perplexity and
next-token agreement for a causal language model, agreement of the last hidden states for an
encoder, on a small text cut into windows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: The text scored when none is given: a few paragraphs written for kattn (plain English, so
#: a language model's tokenizer meets ordinary words), about what the conversion does.
EMBEDDED_TEXT = """\
Attention lets every position of a sequence look at every other one. A query is compared with
each key, the scores are turned into weights by a softmax, and the output is the weighted
average of the values. The comparison of all pairs is what makes attention expensive: the
time and the memory grow with the square of the length of the sequence.

Kernelized attention writes the exponential of the dot product of a query and a key as the
dot product of two feature vectors. Once queries and keys are mapped to features, the sums
over keys can be computed once and shared by every query, so the cost grows linearly with
the length. Random features give an unbiased estimate of the softmax kernel; the more
features, the smaller the error of the estimate.

A model trained with softmax attention can be converted without training again: its
projections, norms and feed-forward layers keep their weights, and only the attention core
changes. The converted model computes an approximation of the same function. How close it
stays depends on the sizes of the queries and keys, on the number of features and on how
sharp the attention of the trained model is. Normalising queries and keys before they meet
keeps their sizes bounded and makes the conversion much gentler.

To see the effect, score the model before and after on the same text. For a language model
the perplexity tells how surprised the model is by each next word, and the agreement of the
next-word predictions tells how often the two models pick the same word. For an encoder the
cosine between the hidden states of the two models tells how far each token's
representation moved.
"""


def read_text(path: str | Path | None) -> tuple[str, dict[str, Any]]:
    """The text to score (``path``, or :data:`EMBEDDED_TEXT` when None) and where it came from."""
    if path is None:
        return EMBEDDED_TEXT, {"source": "embedded", "bytes": len(EMBEDDED_TEXT.encode())}
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"text file {str(file)!r} does not exist")
    text = file.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"text file {str(file)!r} is empty")
    return text, {"source": str(file), "bytes": len(text.encode())}


def token_ids(text: str, tokenizer: Any, vocab_size: int) -> tuple[Tensor, str]:
    """``(ids, how)``: the text through ``tokenizer``, or its UTF-8 bytes when there is none
    (modulo ``vocab_size`` if the vocabulary is smaller than 256)."""
    if tokenizer is not None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long), f"its tokenizer ({type(tokenizer).__name__})"
    ids = torch.tensor(list(text.encode()), dtype=torch.long)
    if vocab_size >= 256:
        return ids, "bytes as token ids (no tokenizer in the checkpoint)"
    return ids % vocab_size, f"bytes modulo {vocab_size} as token ids (no tokenizer)"


def windows(ids: Tensor, *, length: int, max_tokens: int) -> Tensor:
    """``(N, length)`` consecutive windows of the first ``max_tokens`` ids (a last, shorter
    remainder dropped); one window of all the ids when there are fewer than ``length``."""
    ids = ids[:max_tokens]
    if ids.numel() < 2:
        raise ValueError(f"the text gives {ids.numel()} token(s); at least 2 are needed")
    if ids.numel() < length:
        return ids[None]
    count = ids.numel() // length
    return ids[: count * length].reshape(count, length)


@torch.no_grad()
def causal_lm_outputs(model: nn.Module, inputs: Tensor, batch_size: int) -> dict[str, Any]:
    """Next-token negative log-likelihood (nats), perplexity and the argmax predictions."""
    device = next(model.parameters()).device
    total, count, predictions = 0.0, 0, []
    for chunk in inputs.split(batch_size):
        chunk = chunk.to(device)
        logits = model(input_ids=chunk, use_cache=False).logits[:, :-1].float()
        targets = chunk[:, 1:]
        total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        count += targets.numel()
        predictions.append(logits.argmax(-1).cpu())
    nll = total / count
    return {"nll": nll, "perplexity": math.exp(nll), "tokens": count,
            "predictions": torch.cat(predictions)}  # fmt: skip


@torch.no_grad()
def last_hidden_states(model: nn.Module, inputs: Tensor, batch_size: int) -> Tensor:
    """The last layer's hidden states ``(N, L, width)`` of every window, in float64."""
    device = next(model.parameters()).device
    states = []
    for chunk in inputs.split(batch_size):
        out = model(input_ids=chunk.to(device), output_hidden_states=True)
        states.append(out.hidden_states[-1].double().cpu())
    return torch.cat(states)


def hidden_state_agreement(before: Tensor, after: Tensor) -> dict[str, float]:
    """How far the hidden states moved: the mean and smallest cosine per token and the
    relative Frobenius error ``‖after − before‖ / ‖before‖``."""
    cosine = F.cosine_similarity(before, after, dim=-1)
    error = (after - before).norm() / before.norm().clamp_min(1e-30)
    return {"mean_cosine": cosine.mean().item(), "min_cosine": cosine.min().item(),
            "relative_error": error.item()}  # fmt: skip


def prediction_agreement(before: Tensor, after: Tensor) -> float:
    """The share of positions where the two models predict the same next token."""
    return (before == after).double().mean().item()
