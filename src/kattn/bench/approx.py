"""Approximation studies: how well random features estimate softmax attention.

:func:`norm_sweep` is the experiment of Luo et al. 2021 §3.3 (Fig. 1b): one query and ``keys``
keys drawn uniformly on the unit sphere of dimension d and scaled by R; the softmax attention
row ``A_j = exp(q·k_j) / Σ_j exp(q·k_j)`` against its random-feature estimate
``Â_j = φ(q)·φ(k_j) / Σ_j φ(q)·φ(k_j)``, error ``‖A − Â‖₁`` averaged over seeds. For PRF the
error grows with R (the estimator's variance grows like ``exp(‖q‖² + ‖k‖²)``) and, at R = 1,
falls as the number of features M grows. The normalised case (NPRF) ℓ2-normalises q and k
first, so it estimates ``softmax(q̂·k̂)`` whatever R. The figure draws the rows of the
projection W i.i.d. from N(0, I_d) (``sampling="iid"``, the default here); ``"orthogonal"``
(the feature maps' own default) and ``"sphere"`` are there for comparison.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import features as feature_maps
from .style import pyplot, save_figure

#: the variants of the study: (label, feature map, normalise q and k)
NORM_SWEEP_VARIANTS = (("prf", "prf", False), ("trf", "trf", False), ("nprf", "prf", True))
#: how the study may draw W: its name here -> the feature maps' ``sampling`` option
SAMPLINGS = {"iid": "gaussian", "orthogonal": "orthogonal", "sphere": "sphere"}


@dataclass(frozen=True)
class SweepRow:
    """One cell of the study: mean and standard deviation of ``‖A − Â‖₁`` over seeds."""

    variant: str
    radius: float
    features: int
    l1_error: float
    l1_error_std: float
    seeds: int
    sampling: str = "iid"


def _unit_sphere(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=-1)


def study_feature_map(
    feature_map: str, dim: int, num_features: int, seed: int, sampling: str = "iid"
) -> feature_maps.FeatureMap:
    """A float64 ``feature_map`` with ``num_features`` features for head dimension ``dim``, W
    drawn (seeded by ``seed``) as ``sampling`` says (a key of :data:`SAMPLINGS`)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    with torch.random.fork_rng():  # a seeded draw that leaves the caller's RNG alone
        torch.manual_seed(seed)
        return feature_maps.build(
            feature_map,
            head_dim=dim,
            num_heads=1,
            num_features=num_features,
            sampling=SAMPLINGS[sampling],
            redraw="never",
        ).double()


def attention_row_error(
    feature_map: str,
    q: torch.Tensor,
    k: torch.Tensor,
    num_features: int,
    seed: int,
    sampling: str = "iid",
) -> float:
    """``‖A − Â‖₁`` for one query ``q (d,)`` and keys ``k (n, d)`` with a fresh draw of
    ``num_features`` features of ``feature_map`` (:func:`study_feature_map`)."""
    fm = study_feature_map(feature_map, q.shape[-1], num_features, seed, sampling)
    exact = torch.softmax(k @ q, dim=0)
    fq = fm.query_values(q[None, None, None, :]).reshape(-1)
    out = fm(k[None, None])
    fk = out.values[0, 0]
    if out.log_scale is not None:  # shift the key log-scales: the shift cancels in Â
        s = out.log_scale[0, 0]
        fk = fk * torch.exp(s - s.max())[:, None]
    weights = fk @ fq
    estimate = weights / weights.sum()
    return float((exact - estimate).abs().sum())


def norm_sweep(
    *,
    radii: tuple[float, ...] = (1, 2, 3, 4, 5),
    features: tuple[int, ...] = (4, 16, 64, 256, 1024),
    dim: int = 64,
    keys: int = 1024,
    seeds: int = 10,
    variants: tuple[tuple[str, str, bool], ...] = NORM_SWEEP_VARIANTS,
    sampling: str = "iid",
) -> list[SweepRow]:
    """The study of Luo et al. 2021 Fig. 1b for each variant ``(label, feature map,
    normalise)``, the projections drawn by ``sampling`` (i.i.d. Gaussian rows, as in the
    figure, by default)."""
    rows = []
    for label, name, normalize in variants:
        for radius in radii:
            for m in features:
                errors = []
                for seed in range(seeds):
                    g = torch.Generator().manual_seed(seed)
                    q = _unit_sphere(1, dim, g)[0] * radius
                    k = _unit_sphere(keys, dim, g) * radius
                    if normalize:
                        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
                    errors.append(
                        attention_row_error(name, q, k, m, seed=10_000 + seed, sampling=sampling)
                    )
                std = statistics.stdev(errors) if len(errors) > 1 else 0.0
                mean = statistics.mean(errors)
                rows.append(SweepRow(label, float(radius), m, mean, std, seeds, sampling))
    return rows


def rows_to_csv(rows: list[SweepRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    return buffer.getvalue()


def rows_to_markdown(rows: list[SweepRow]) -> str:
    """One table per variant: radius down, number of features across."""
    lines = []
    for variant in dict.fromkeys(r.variant for r in rows):
        mine = [r for r in rows if r.variant == variant]
        ms = sorted({r.features for r in mine})
        lines += [
            f"**{variant}** (W {mine[0].sampling}): mean ‖A − Â‖₁ over {mine[0].seeds} seeds",
            "",
            "| R | " + " | ".join(f"M={m}" for m in ms) + " |",
            "|---|" + "---|" * len(ms),
        ]
        for radius in sorted({r.radius for r in mine}):
            cells = {r.features: r.l1_error for r in mine if r.radius == radius}
            lines.append(f"| {radius:g} | " + " | ".join(f"{cells[m]:.3f}" for m in ms) + " |")
        lines.append("")
    return "\n".join(lines)


_TITLES = {"nprf": "NPRF (q, k normalised: the R curves coincide)"}


def plot_norm_sweep(rows: list[SweepRow], path: Path, caption: str = "") -> Path | None:
    """Error against M, one line per R, one panel per variant (log-log). None without
    matplotlib (``pip install kattn[plot]``)."""
    plt = pyplot()
    if plt is None:
        return None
    variants = list(dict.fromkeys(r.variant for r in rows))
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), sharey=True)
    axes = [axes] if len(variants) == 1 else list(axes)
    radii = sorted({r.radius for r in rows})
    colors = plt.get_cmap("viridis")([i / max(1, len(radii) - 1) for i in range(len(radii))])
    for ax, variant in zip(axes, variants, strict=True):
        for color, radius in zip(colors, radii, strict=True):
            mine = sorted((r for r in rows if r.variant == variant and r.radius == radius),
                          key=lambda r: r.features)  # fmt: skip
            sem = [r.l1_error_std / math.sqrt(r.seeds) for r in mine]  # standard error
            ax.errorbar([r.features for r in mine], [r.l1_error for r in mine], yerr=sem,
                        color=color, marker="o", markersize=3, capsize=2,
                        label=f"R = {radius:g}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("number of random features M")
        ax.set_title(_TITLES.get(variant, variant.upper()), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("‖A − Â‖₁ (one attention row)")
    axes[-1].legend(fontsize=8)
    return save_figure(fig, path, caption)
