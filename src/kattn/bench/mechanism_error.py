"""Every approximate mechanism against the exact attention it approximates, on the same inputs.

For each approximate registered mechanism (``spec(name).is_exact`` False, or exact over a
restricted pattern with a declared ``approximates``, like the local and block-sparse
baselines, whose error is what their pattern leaves out), built with its
registered defaults and in ``eval()`` (features and landmarks fixed, a fresh draw per seed),
and each length L: the relative Frobenius error ``‖Ŷ − Y‖_F / ‖Y‖_F`` of the ``(L, Dv)``
output of every head against its exact counterpart ``Y`` (the :data:`EXACT_REFERENCES` entry
its registration names as ``approximates``), non-causal and (where the mechanism supports it)
causal; mean and standard error over heads × seeds. q and k have iid ``N(0, σ²)`` entries,
v ``N(0, 1)`` entries (the error is relative, so the scale of v does not matter); mechanisms
run in float32, references in float64.

Mechanisms with no exact counterpart (``approximates`` None) are compared with softmax attention
for information, marked as such in every output: their error says how far from softmax they
start, not how well they approximate anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import registry
from ..functional.gaussian import gaussian_attention
from ..functional.softmax import softmax_attention
from .spectral import BERT_INIT_STD
from .style import mechanism_color, pyplot, save_figure

Reference = Callable[[Tensor, Tensor, Tensor, bool], Tensor]

#: The exact references, ``(q, k, v, causal) → (B, H, L, Dv)``.
EXACT_REFERENCES: dict[str, Reference] = {
    # softmax(q·k/√D) v
    "softmax": lambda q, k, v, causal: softmax_attention(q, k, v, causal=causal),
    # κ(Q/D^¼, K/D^¼) V with the Gaussian kernel and no row normalisation (Skyformer's target)
    "gaussian": lambda q, k, v, causal: gaussian_attention(q, k, v, causal=causal),
    # softmax(q̂·k̂) v with ℓ2-normalised q and k and scale 1 (what NPRF estimates)
    "softmax_unit_qk": lambda q, k, v, causal: softmax_attention(
        F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, causal=causal, scale=1.0
    ),
}

#: the reference of the mechanisms without an exact counterpart
INFORMATION_REFERENCE = "softmax"


def approximate_mechanisms() -> list[str]:
    """The registered mechanisms that are not exact, or exact over a restricted pattern and
    standing in for a full attention (``approximates`` set), sorted."""
    specs = {n: registry.spec(n) for n in registry.available()}
    return [n for n, s in specs.items() if not s.is_exact or s.approximates is not None]


def counterpart(name: str) -> tuple[str, bool]:
    """``(reference, is its exact counterpart)`` for mechanism ``name``."""
    reference = registry.spec(name).approximates
    return (INFORMATION_REFERENCE, False) if reference is None else (reference, True)


@dataclass(frozen=True)
class MechanismRow:
    """Mean and standard error over heads × seeds of ``‖Ŷ − Y‖_F / ‖Y‖_F``."""

    mechanism: str
    reference: str
    counterpart: bool
    causal: bool
    length: int
    rel_error: float
    rel_error_sem: float
    samples: int


def relative_frobenius_error(approx: Tensor, exact: Tensor) -> Tensor:
    """``‖Ŷ − Y‖_F / ‖Y‖_F`` per ``(L, Dv)`` matrix of ``(..., L, Dv)`` outputs (float64)."""
    approx, exact = approx.double(), exact.double()
    num = torch.linalg.matrix_norm(approx - exact)
    return num / torch.linalg.matrix_norm(exact).clamp_min(1e-300)


def mechanism_study(
    names: Sequence[str] | None = None,
    *,
    lengths: tuple[int, ...] = (256, 1024),
    head_dim: int = 64,
    heads: int = 4,
    seeds: int = 2,
    input_std: float = BERT_INIT_STD,
    progress: Callable[[str], None] | None = None,
) -> list[MechanismRow]:
    """The study for ``names`` (default: every approximate mechanism)."""
    names = list(names) if names is not None else approximate_mechanisms()
    errors: dict[tuple[str, bool, int], list[float]] = {}
    for length in lengths:
        for seed in range(seeds):
            if progress is not None:
                progress(f"L = {length}, seed {seed}")
            g = torch.Generator().manual_seed(seed)
            q, k, v = (torch.randn(1, heads, length, head_dim, generator=g) for _ in range(3))
            q, k = q * input_std, k * input_std
            exact: dict[tuple[str, bool], Tensor] = {}
            for name in names:
                with torch.random.fork_rng():
                    torch.manual_seed(10_000 + seed)
                    attn = registry.build(
                        name, head_dim=head_dim, num_heads=heads, max_len=length
                    ).eval()
                reference, _ = counterpart(name)
                for causal in (False, True) if attn.supports_causal else (False,):
                    if (reference, causal) not in exact:
                        fn = EXACT_REFERENCES[reference]
                        exact[reference, causal] = fn(q.double(), k.double(), v.double(), causal)
                    with torch.no_grad():
                        err = relative_frobenius_error(
                            attn(q, k, v, causal=causal), exact[reference, causal]
                        )
                    errors.setdefault((name, causal, length), []).extend(err.flatten().tolist())
    rows = []
    for (name, causal, length), e in errors.items():
        sem = statistics.stdev(e) / math.sqrt(len(e)) if len(e) > 1 else 0.0
        reference, is_counterpart = counterpart(name)
        rows.append(MechanismRow(name, reference, is_counterpart, causal, length,
                                 statistics.mean(e), sem, len(e)))  # fmt: skip
    return sorted(rows, key=lambda r: (not r.counterpart, r.mechanism, r.causal, r.length))


def mechanism_markdown(rows: list[MechanismRow]) -> str:
    """One table: mechanisms down (those with an exact counterpart first), lengths across,
    non-causal then causal."""
    lengths = sorted({r.length for r in rows})
    modes = [c for c in (False, True) if any(r.causal == c for r in rows)]
    heads = [f"L={n}{' causal' if c else ''}" for c in modes for n in lengths]
    lines = [
        f"mean ‖Ŷ − Y‖_F / ‖Y‖_F (± standard error) over {rows[0].samples} heads × seeds; "
        "n/a: the mechanism has no causal mode",
        "",
        "| mechanism | compared with | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(heads),
    ]
    for name in dict.fromkeys(r.mechanism for r in rows):
        cells = {(r.causal, r.length): r for r in rows if r.mechanism == name}
        first = next(iter(cells.values()))
        against = (
            first.reference if first.counterpart else f"{first.reference} (no exact counterpart)"
        )
        text = [
            f"{cells[c, n].rel_error:.3g} ± {cells[c, n].rel_error_sem:.1g}"
            if (c, n) in cells
            else "n/a"
            for c in modes
            for n in lengths
        ]
        lines.append(f"| {name} | {against} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def plot_mechanisms(rows: list[MechanismRow], path: Path, caption: str = "") -> Path | None:
    """Relative error against L (log-log), one panel per mode (non-causal, causal), one line
    per mechanism in its colour; dashed: no exact counterpart (compared with softmax for
    information). None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    modes = [c for c in (False, True) if any(r.causal == c for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.0 * len(modes) + 2.5, 4.4), sharey=True)
    axes = [axes] if len(modes) == 1 else list(axes)
    for ax, causal in zip(axes, modes, strict=True):
        for name in dict.fromkeys(r.mechanism for r in rows):
            mine = sorted((r for r in rows if r.mechanism == name and r.causal == causal
                           and r.rel_error > 0), key=lambda r: r.length)  # fmt: skip
            if not mine:
                continue
            against = mine[0].reference + ("" if mine[0].counterpart else ", for information")
            ax.errorbar([r.length for r in mine], [r.rel_error for r in mine],
                        yerr=[r.rel_error_sem for r in mine], color=mechanism_color(name),
                        linestyle="-" if mine[0].counterpart else "--", marker="o",
                        markersize=3, capsize=2, label=f"{name} vs {against}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lengths = sorted({r.length for r in rows})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("sequence length L (tokens)")
        ax.set_title("causal" if causal else "non-causal", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(r"relative error $\|\hat Y - Y\|_F \,/\, \|Y\|_F$")
    handles, labels = [], []
    for ax in axes:  # every mechanism once (some have no causal mode)
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    axes[-1].legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save_figure(fig, path, caption)
