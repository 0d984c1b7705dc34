"""Spectral-norm approximation study of Chen et al. 2021 (Skyformer) §4.5 (Fig. 1).

For each approximate mechanism and its exact counterpart, on the same random Q, K, V: the
relative spectral-norm error ``‖Ŷ − Y‖₂ / ‖Y‖₂`` of the outputs (``‖·‖₂`` the largest singular
value of the ``(L, Dv)`` output of one head), as the number of landmarks / features /
projected length m grows. Skyformer is compared with the exact Gaussian-kernel attention it
approximates; Nyströmformer, Performer and Linformer (random projections, untrained) with
softmax attention.

Inputs are at the initialisation scale of the paper's models (BERT-base: q = x W with
LayerNorm'ed x of width 768 and weights of std 0.02, so q, k and v have entries of std
``0.02·√768 ≈ 0.55``): iid ``N(0, input_std²)`` entries.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import registry
from ..functional.gaussian import gaussian_attention
from ..functional.softmax import softmax_attention
from .style import mechanism_color, pyplot, save_figure

#: (mechanism, exact reference, the option that sets m)
SPECTRAL_PAIRS = (
    ("skyformer", "gaussian", "num_landmarks"),
    ("nystromformer", "softmax", "num_landmarks"),
    ("performer", "softmax", "num_features"),
    ("linformer", "softmax", "proj_dim"),
)
#: entry std of q, k, v in an initialised BERT-base layer
BERT_INIT_STD = 0.02 * math.sqrt(768)
_EXACT = {"gaussian": gaussian_attention, "softmax": softmax_attention}


@dataclass(frozen=True)
class SpectralRow:
    """Mean and standard deviation over seeds × heads of the relative spectral error."""

    mechanism: str
    reference: str
    length: int
    features: int
    rel_error: float
    rel_error_std: float
    samples: int


def relative_spectral_error(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``‖Ŷ − Y‖₂ / ‖Y‖₂`` for each matrix of ``(..., L, Dv)`` outputs (in float64)."""
    approx, exact = approx.double(), exact.double()
    num = torch.linalg.matrix_norm(approx - exact, ord=2)
    return num / torch.linalg.matrix_norm(exact, ord=2).clamp_min(1e-300)


def spectral_study(
    *,
    lengths: tuple[int, ...] = (256, 512, 1024),
    features: tuple[int, ...] = (16, 32, 64, 128, 256),
    head_dim: int = 64,
    heads: int = 4,
    seeds: int = 5,
    input_std: float = BERT_INIT_STD,
    pairs: tuple[tuple[str, str, str], ...] = SPECTRAL_PAIRS,
    progress: Callable[[str], None] | None = None,
) -> list[SpectralRow]:
    """The study for every ``(mechanism, reference, option)`` of ``pairs``; mechanisms in
    ``eval()`` (fixed landmarks and features), a fresh draw of them for every seed."""
    errors: dict[tuple[str, str, int, int], list[float]] = {}
    for length in lengths:
        if progress is not None:
            progress(f"L = {length}")
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            q, k, v = (torch.randn(1, heads, length, head_dim, generator=g) for _ in range(3))
            q, k, v = q * input_std, k * input_std, v * input_std
            exact = {name: fn(q, k, v) for name, fn in _EXACT.items()}
            for name, reference, option in pairs:
                for m in features:
                    with torch.random.fork_rng():
                        torch.manual_seed(10_000 * seed + m)
                        attn = registry.build(
                            name, head_dim=head_dim, num_heads=heads, max_len=length, **{option: m}
                        ).eval()
                    with torch.no_grad():
                        err = relative_spectral_error(attn(q, k, v), exact[reference])
                    errors.setdefault((name, reference, length, m), []).extend(
                        err.flatten().tolist()
                    )
    return [
        SpectralRow(*key, statistics.mean(e), statistics.stdev(e) if len(e) > 1 else 0.0, len(e))
        for key, e in errors.items()
    ]


def spectral_markdown(rows: list[SpectralRow]) -> str:
    """One table per length: mechanisms down, m across."""
    lines = []
    for length in sorted({r.length for r in rows}):
        mine = [r for r in rows if r.length == length]
        ms = sorted({r.features for r in mine})
        lines += [
            f"**L = {length}**: mean ‖Ŷ − Y‖₂ / ‖Y‖₂ over {mine[0].samples} heads × seeds",
            "",
            "| mechanism (vs exact) | " + " | ".join(f"m={m}" for m in ms) + " |",
            "|---|" + "---|" * len(ms),
        ]
        for name in dict.fromkeys(r.mechanism for r in mine):
            cells = {r.features: r for r in mine if r.mechanism == name}
            ref = next(iter(cells.values())).reference
            lines.append(
                f"| {name} (vs {ref}) | "
                + " | ".join(f"{cells[m].rel_error:.3g}" for m in ms)
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_spectral(rows: list[SpectralRow], path: Path, caption: str = "") -> Path | None:
    """Relative error against m, one panel per length, one line per mechanism (log-log);
    exact results (error 0, e.g. Nyströmformer with m >= L) are left out of the plot. None
    without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    lengths = sorted({r.length for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.6), sharey=True)
    axes = [axes] if len(lengths) == 1 else list(axes)
    for ax, length in zip(axes, lengths, strict=True):
        for name in dict.fromkeys(r.mechanism for r in rows):
            mine = sorted(
                (r for r in rows if r.length == length and r.mechanism == name and r.rel_error > 0),
                key=lambda r: r.features,
            )
            if not mine:
                continue
            sem = [r.rel_error_std / math.sqrt(r.samples) for r in mine]
            ax.errorbar([r.features for r in mine], [r.rel_error for r in mine], yerr=sem,
                        color=mechanism_color(name), marker="o", markersize=3, capsize=2,
                        label=f"{name} vs {mine[0].reference}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("landmarks / features / projected length m")
        ax.set_title(f"L = {length}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("relative spectral error ‖Ŷ − Y‖₂ / ‖Y‖₂")
    axes[-1].legend(fontsize=7)
    return save_figure(fig, path, caption)
