"""Training-stability study of Chen et al. 2021 Appendix F (Table 3), after Liu et al. (2020).

For each mechanism, a small classifier (two pre-LN layers, width 64, 2 heads, MLP 128, mean
pooling: Skyformer's LRA model) is trained for ``steps`` AdamW steps on the same batches from
the same initial weights as a softmax model. At step i, with batch ``x_i`` and the weights
``W_{i−1}`` before and ``W_i`` after the update, the instability score is

    τ_i = ‖f(x_i, W_i) − f(x_i, W_{i−1})‖²_F / ‖W_i − W_{i−1}‖²_F,

f the encoder's output features (after the two layers and the final LayerNorm, as the
model of the paper's code; evaluated in ``eval()`` mode: no dropout, fixed landmarks). The
table reports the mean over steps of ``τ_i / τ_i(softmax)``: below 1, the output moves less
than softmax attention's for the same size of parameter update.

The batches are synthetic (uniform random tokens, labels = sum of tokens mod the number of
classes; :func:`instability_scores` takes any batches): the score measures how the model
responds to its own updates in the first steps, which the paper computes on the LRA tasks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..nn.classifiers import SequenceClassifier
from .style import mechanism_color, pyplot, save_figure

#: the mechanisms of the paper's Table 3 (each compared with softmax)
TABLE3_MECHANISMS = ("nystromformer", "gaussian", "skyformer")
#: Skyformer's LRA model
MODEL = {"dim": 64, "depth": 2, "num_heads": 2, "ffn_dim": 128, "dropout": 0.1}
#: the learning rate of the paper's first steps: one-cycle from max_lr/25 with max_lr = 1e-4
#: (and 1000 warm-up steps, so it is still about 4e-6 at step 20)
LEARNING_RATE = 1e-4 / 25

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class StepScore:
    """τ_i of one mechanism at one step of one seed, and its ratio to softmax's τ_i."""

    mechanism: str
    seed: int
    step: int
    tau: float
    ratio: float


def synthetic_batches(
    steps: int, *, batch: int = 8, length: int = 512, vocab: int = 32, classes: int = 10,
    seed: int = 0,
) -> list[Batch]:  # fmt: skip
    """``steps`` batches of uniform tokens in ``[1, vocab)`` with labels ``Σ tokens mod
    classes``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(1, vocab, (batch, length), generator=g)
        out.append((tokens, tokens.sum(dim=1) % classes))
    return out


def instability_scores(
    model: SequenceClassifier,
    batches: Sequence[Batch],
    *,
    lr: float = LEARNING_RATE,
    seed: int = 0,
) -> list[float]:
    """τ_i for each batch, training ``model`` in place (AdamW as in the paper's LRA code:
    betas (0.9, 0.999), eps 1e-6, no weight decay; gradient values clipped to 1).

    ``‖W_i − W_{i−1}‖²`` runs over every trainable parameter, as the paper defines it. The
    global RNG is seeded from ``seed`` and the step before each training forward, so models
    that draw nothing else get the same dropout masks."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0)
    scores = []
    for step, (tokens, labels) in enumerate(batches):
        torch.manual_seed(1_000_003 * seed + step)
        model.train()
        loss = F.cross_entropy(model(tokens), labels) + model.regularization_loss()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, 1.0)
        before = [p.detach().clone() for p in params]
        model.eval()
        with torch.no_grad():
            f_before = model.encoder(tokens)
            optimiser.step()
            f_after = model.encoder(tokens)
            moved = sum(float((p - b).square().sum()) for p, b in zip(params, before, strict=True))
            change = float((f_after - f_before).square().sum())
        scores.append(change / moved if moved > 0 else math.nan)
    return scores


def build_model(
    mechanism: str, *, seed: int, length: int, vocab: int, classes: int,
    reference: SequenceClassifier | None = None,
) -> SequenceClassifier:  # fmt: skip
    """The classifier with ``mechanism``; with ``reference``, every weight the two share by
    name and shape is copied from it (so the models start from the same point)."""
    torch.manual_seed(seed)
    model = SequenceClassifier(vocab, length, classes, mechanism=mechanism, **MODEL)  # type: ignore[arg-type]
    if reference is not None:
        mine = model.state_dict()
        shared = {
            name: value
            for name, value in reference.state_dict().items()
            if name in mine and mine[name].shape == value.shape
        }
        model.load_state_dict(shared, strict=False)
    return model


def stability_study(
    mechanisms: Sequence[str] = TABLE3_MECHANISMS,
    *,
    steps: int = 20,
    seeds: int = 5,
    batch: int = 8,
    length: int = 512,
    vocab: int = 32,
    classes: int = 10,
    lr: float = LEARNING_RATE,
    progress: Callable[[str], None] | None = None,
) -> list[StepScore]:
    """τ_i of softmax and of each mechanism on the same batches from the same start, for
    ``seeds`` seeds; ratios to softmax's τ_i."""
    rows = []
    for seed in range(seeds):
        batches = synthetic_batches(
            steps, batch=batch, length=length, vocab=vocab, classes=classes, seed=seed
        )
        softmax = build_model("softmax", seed=seed, length=length, vocab=vocab, classes=classes)
        start = {k: v.clone() for k, v in softmax.state_dict().items()}
        base = instability_scores(softmax, batches, lr=lr, seed=seed)
        softmax.load_state_dict(start)
        for name in ("softmax", *mechanisms):
            if progress is not None:
                progress(f"seed {seed}: {name}")
            if name == "softmax":
                taus = base
            else:
                model = build_model(
                    name, seed=seed, length=length, vocab=vocab, classes=classes, reference=softmax
                )
                taus = instability_scores(model, batches, lr=lr, seed=seed)
            for i, (tau, ref) in enumerate(zip(taus, base, strict=True), start=1):
                rows.append(StepScore(name, seed, i, tau, tau / ref))
    return rows


def summary(rows: Sequence[StepScore]) -> dict[str, tuple[float, float, int]]:
    """Per mechanism: mean over seeds of the mean ratio over steps, its standard deviation
    over seeds, and the number of seeds."""
    out = {}
    for name in dict.fromkeys(r.mechanism for r in rows):
        seeds = sorted({r.seed for r in rows if r.mechanism == name})
        per_seed = [
            statistics.mean(r.ratio for r in rows if r.mechanism == name and r.seed == s)
            for s in seeds
        ]
        spread = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
        out[name] = (statistics.mean(per_seed), spread, len(per_seed))
    return out


def stability_markdown(rows: Sequence[StepScore]) -> str:
    steps = max(r.step for r in rows)
    lines = [
        f"Mean over {steps} steps of τ_i / τ_i(softmax); ± standard deviation over seeds.",
        "",
        "| mechanism | ratio to softmax | seeds |",
        "|---|---|---|",
    ]
    for name, (mean, spread, seeds) in summary(rows).items():
        lines.append(f"| {name} | {mean:.3f} ± {spread:.3f} | {seeds} |")
    return "\n".join(lines) + "\n"


def plot_stability(rows: Sequence[StepScore], path: Path, caption: str = "") -> Path | None:
    """τ_i / τ_i(softmax) against the step, mean over seeds, one line per mechanism."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name in dict.fromkeys(r.mechanism for r in rows):
        steps = sorted({r.step for r in rows if r.mechanism == name})
        means = [
            statistics.mean(r.ratio for r in rows if r.mechanism == name and r.step == s)
            for s in steps
        ]
        ax.plot(steps, means, marker="o", markersize=3, color=mechanism_color(name), label=name)
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    candidates = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 20.0, 50.0)
    ticks = [t for t in candidates if low <= t <= high] or [1.0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimiser step i")
    ax.set_ylabel("τ_i / τ_i(softmax)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, caption)
