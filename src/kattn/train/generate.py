"""Continue a prompt with a trained language-model run (``kattn generate``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..nn import CausalLM
from .trained import load_trained_model


@dataclass(frozen=True)
class Generation:
    """The continuations of one prompt and how long they took (``tokens_per_s`` counts the new
    tokens of every sample)."""

    samples: list[str]
    mechanism: str
    strategy: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    tokens_per_s: float


def generate_text(
    run: str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    num_samples: int = 1,
    checkpoint: str = "best",
    strategy: str = "auto",
    device: str = "cpu",
) -> Generation:
    """``num_samples`` continuations of ``prompt`` by the ``checkpoint`` model of the run
    folder ``run`` (:meth:`kattn.nn.CausalLM.generate`; temperature 0 is greedy), sampled
    with a generator seeded by ``seed``."""
    model, _, tokenizer = load_trained_model(run, checkpoint=checkpoint, device=device)
    if not isinstance(model, CausalLM) or tokenizer is None:
        raise ValueError(f"{run} is not a language-model run (train it with --task lm)")
    if num_samples < 1:
        raise ValueError(f"--num-samples must be positive, got {num_samples}")
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("--prompt is empty once tokenised: give at least one token of text")
    where = model.head.weight.device
    start = torch.tensor([list(ids)] * num_samples, dtype=torch.int64, device=where)
    generator = torch.Generator(device=where).manual_seed(seed)
    started = time.perf_counter()
    out = model.generate(start, max_new_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, generator=generator, strategy=strategy)  # fmt: skip
    seconds = time.perf_counter() - started
    texts = [tokenizer.decode(row.tolist()) for row in out]
    new = out.shape[1] - start.shape[1]
    if strategy == "auto":
        strategy = "recurrent" if model.supports_recurrent else "reencode"
    return Generation(
        samples=texts,
        mechanism=model.mechanism,
        strategy=strategy,
        prompt_tokens=start.shape[1],
        new_tokens=new,
        seconds=seconds,
        tokens_per_s=new * len(texts) / max(seconds, 1e-9),
    )
