"""Random-feature maps against their exact kernels as the number of features M grows.

For every variant of :data:`KERNEL_VARIANTS` and every M, on random queries and keys
``q_i, k_j`` with iid ``N(0, σ²)`` entries, the estimate ``K̂ = φ(√s·Q) φ(√s·K)ᵀ`` against the
kernel it estimates, ``K_ij = κ(√s·q_i, √s·k_j)``, with ``s = 1/√D`` the scale kernelized
attention uses for these maps (so for the softmax kernel ``K_ij = exp(q_i·k_j/√D)``, the
numerator of softmax attention). Reported: the mean squared error over the ``(Lq, Lk)``
entries, ``MSE = mean (K̂ − K)²``, and the relative ``MSE / mean K²``, as means over seeds
(a fresh draw of inputs and of features per seed) with their standard errors. For an unbiased
estimator the MSE is its variance and falls like ``1/M``; a bias shows as a floor.

The kernel of each map follows from the density its frequencies are drawn from (verified
against the code in ``kattn.features``):

* ``prf`` (PRF, FAVOR+) and ``trf`` (TRF, RFA): ``ω ~ N(0, I)`` → ``exp(x·y)``, with
  orthogonal (``sampling="orthogonal"``, the default) or iid Gaussian rows.
* ``gmm_prf``: at initialisation ``ω ~ (1/C) Σ_c N(μ_c, I)`` with small random means
  ``μ_c ~ U(±1/√D)``, not the standard Gaussian: the exact kernel is
  ``exp(−‖x‖²/2 − ‖y‖²/2) · (1/C) Σ_c exp(μ_c·z + ½ zᵀ diag(v_c) z)``, ``z = x + y``
  (``= exp(x·y) · (1/C) Σ_c exp(μ_c·z)`` at ``v_c = 1``), computed from the map's parameters.
* ``gmm_rks``: ``(1/C) Σ_c exp(−½ δᵀ Σ_cΣ_cᵀ δ) cos(μ_c·δ)``, ``δ = x − y`` (the ± pairs of
  frequencies make the estimate unbiased for it).
* ``fastfood_prf`` / ``fastfood_rks``: FastFood rows are only *approximately* ``N(0, I/σ²)``
  (chi-distributed norms, near-uniform directions), so they are compared with the kernels of
  that Gaussian, ``exp(‖x + y‖²/(2σ²) − ‖x‖²/2 − ‖y‖²/2)`` (``exp(x·y)`` at σ = 1) and
  ``exp(−‖x − y‖²/(2σ²))``; what remains of the difference shows as a floor.

Left out: ``generative_*`` (frequencies ``tanh(g(n))`` from an untrained generator network:
bounded, no closed-form kernel), ``prf`` with ``sampling="sphere"`` (rows of norm √D: biased
for ``exp(x·y)``) and the deterministic maps (``elu``, ``relu``, ``identity``, ``ffk_*``),
which estimate no kernel.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import features as feature_maps
from ..features import FeatureMap, GaussianMixturePRF, GaussianMixtureRKS
from .spectral import BERT_INIT_STD
from .style import mechanism_color, pyplot, save_figure

#: ``κ(fm, x (Lq, D), y (Lk, D)) → (Lq, Lk)`` on already scaled inputs, in float64
ExactKernel = Callable[[FeatureMap, Tensor, Tensor], Tensor]


def softmax_kernel(fm: FeatureMap, x: Tensor, y: Tensor) -> Tensor:
    """``exp(x·y)``, the kernel of PRF and TRF."""
    return torch.exp(x @ y.T)


def _half_sq(x: Tensor, weight: Tensor | None = None) -> Tensor:
    """``½ Σ_d w_d x_d²`` per row (w = 1 without ``weight``)."""
    return 0.5 * (x.square() if weight is None else x.square() * weight).sum(-1)


def fastfood_prf_kernel(fm: FeatureMap, x: Tensor, y: Tensor) -> Tensor:
    """``E exp(ω·(x+y) − ‖x‖²/2 − ‖y‖²/2)`` for ``ω ~ N(0, I/σ²)``."""
    inv = 1.0 / getattr(fm, "sigma", 1.0) ** 2
    cross = inv * (x @ y.T) + (inv - 1.0) * (_half_sq(x)[:, None] + _half_sq(y)[None, :])
    return torch.exp(cross)


def fastfood_rks_kernel(fm: FeatureMap, x: Tensor, y: Tensor) -> Tensor:
    """The Gaussian kernel ``exp(−‖x − y‖²/(2σ²))``."""
    sigma = getattr(fm, "sigma", 1.0)
    return torch.exp(-torch.cdist(x, y).square() / (2 * sigma**2))


def gmm_prf_kernel(fm: FeatureMap, x: Tensor, y: Tensor) -> Tensor:
    """The kernel of positive features over ``ω ~ (1/C) Σ_c N(μ_c, diag(v_c))`` (head 0)."""
    if not isinstance(fm, GaussianMixturePRF):
        raise TypeError(f"expected a GMM-PRF feature map, got {type(fm).__name__}")
    mean = fm.mean[0].detach().double()  # (C, D)
    var = torch.exp(fm.log_variance[0].detach().double())  # (C, D)
    logs = [
        (x * v) @ y.T + (_half_sq(x, v) + x @ mu)[:, None] + (_half_sq(y, v) + y @ mu)[None, :]
        for mu, v in zip(mean, var, strict=True)
    ]
    log_k = torch.logsumexp(torch.stack(logs), dim=0) - math.log(len(logs))
    return torch.exp(log_k - _half_sq(x)[:, None] - _half_sq(y)[None, :])


def gmm_rks_kernel(fm: FeatureMap, x: Tensor, y: Tensor) -> Tensor:
    """``(1/C) Σ_c exp(−½ δᵀ Σ_cΣ_cᵀ δ) cos(μ_c·δ)`` with ``δ = x − y`` (head 0)."""
    if not isinstance(fm, GaussianMixtureRKS):
        raise TypeError(f"expected a GMM-RKS feature map, got {type(fm).__name__}")
    mean = fm.mean[0].detach().double()  # (C, D)
    spread = fm.scale_matrix[0].detach().double()  # (C, D, D)
    total = torch.zeros(x.shape[0], y.shape[0], dtype=torch.float64)
    for mu, s in zip(mean, spread, strict=True):
        a = s @ s.T  # the covariance Σ_cΣ_cᵀ
        xa, ya = x @ a, y @ a
        quad = (xa * x).sum(-1)[:, None] + (ya * y).sum(-1)[None, :] - 2 * xa @ y.T
        total += torch.exp(-0.5 * quad) * torch.cos((x @ mu)[:, None] - (y @ mu)[None, :])
    return total / mean.shape[0]


@dataclass(frozen=True)
class KernelVariant:
    """A feature map, the options it is built with and the kernel it estimates.

    Attributes:
        label: the name in tables, plots and ``--variants``.
        feature_map: a name from ``kattn.features.available()``.
        kernel: the exact kernel in words (for tables).
        exact: computes that kernel from the built map and the scaled inputs.
        options: build options (besides ``num_features``).
        features_per_frequency: 2 where ``num_features`` counts frequencies and each gives a
            cos and a sin feature (the ``rks`` forms), so that M is always the feature count.
    """

    label: str
    feature_map: str
    kernel: str
    exact: ExactKernel
    options: Mapping[str, Any] = field(default_factory=dict)
    features_per_frequency: int = 1


_FIXED = {"redraw": "never"}
_LEARNED = {"resample_every": "never"}
#: the variants of the study (kernels as the maps are at initialisation; see the module notes)
KERNEL_VARIANTS = (
    KernelVariant("prf-orthogonal", "prf", "exp(x·y)", softmax_kernel,
                  {**_FIXED, "sampling": "orthogonal"}),
    KernelVariant("prf-iid", "prf", "exp(x·y)", softmax_kernel, {**_FIXED, "sampling": "gaussian"}),
    KernelVariant("trf-orthogonal", "trf", "exp(x·y)", softmax_kernel,
                  {**_FIXED, "sampling": "orthogonal"}),
    KernelVariant("trf-iid", "trf", "exp(x·y)", softmax_kernel, {**_FIXED, "sampling": "gaussian"}),
    KernelVariant("gmm_prf", "gmm_prf", "exp(x·y)·mean_c exp(μ_c·(x+y))", gmm_prf_kernel, _LEARNED),
    KernelVariant("gmm_rks", "gmm_rks", "mean_c exp(−‖x−y‖²/2)·cos(μ_c·(x−y))", gmm_rks_kernel,
                  _LEARNED, 2),
    KernelVariant("fastfood_prf", "fastfood_prf", "exp(x·y), σ = 1", fastfood_prf_kernel,
                  _LEARNED),
    KernelVariant("fastfood_rks", "fastfood_rks", "exp(−‖x−y‖²/(2σ²)), σ = 1",
                  fastfood_rks_kernel, _LEARNED, 2),
)  # fmt: skip
#: the feature map whose mechanism colour a variant's line takes in plots
_COLOR_OF = {"prf": "performer", "trf": "rfa"}


@dataclass(frozen=True)
class KernelRow:
    """Mean over seeds (and standard error of the mean) of the kernel estimate's errors."""

    variant: str
    feature_map: str
    kernel: str
    features: int
    mse: float
    mse_sem: float
    rel_mse: float
    rel_mse_sem: float
    seeds: int


def build_variant(variant: KernelVariant, m: int, dim: int, seed: int) -> FeatureMap:
    """``variant``'s map with M = ``m`` features for one head, its draws seeded, in float64."""
    per = variant.features_per_frequency
    if m % per:
        raise ValueError(f"{variant.label} needs M a multiple of {per}, got {m}")
    g = torch.Generator().manual_seed(seed)
    fm = feature_maps.build(variant.feature_map, head_dim=dim, num_heads=1,
                            num_features=m // per, generator=g, **variant.options)  # fmt: skip
    if fm.num_features != m:
        raise ValueError(f"{variant.label} built {fm.num_features} features, expected {m}")
    return fm.double().eval()


def estimate(fm: FeatureMap, q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``K̂ = φ(√s·q) φ(√s·k)ᵀ (Lq, Lk)`` for ``q (Lq, D)``, ``k (Lk, D)``, the per-row
    log-scales of the :class:`~kattn.features.Features` applied after the product (no
    overflow in the features themselves)."""
    with torch.no_grad():
        fq, fk = fm(q[None, None], scale), fm(k[None, None], scale)
    out = fq.values[0, 0] @ fk.values[0, 0].T
    if fq.log_scale is not None and fk.log_scale is not None:
        out = out * torch.exp(fq.log_scale[0, 0][:, None] + fk.log_scale[0, 0][None, :])
    return out


def kernel_errors(
    variant: KernelVariant, m: int, q: Tensor, k: Tensor, seed: int
) -> tuple[float, float]:
    """``(MSE, MSE / mean K²)`` of one draw of ``variant`` with ``m`` features, at the
    softmax scale ``1/√D``."""
    dim = q.shape[-1]
    fm = build_variant(variant, m, dim, seed)
    scale = dim**-0.5
    with torch.no_grad():
        exact = variant.exact(fm, q * math.sqrt(scale), k * math.sqrt(scale))
    mse = float((estimate(fm, q, k, scale) - exact).square().mean())
    return mse, mse / float(exact.square().mean())


def kernel_study(
    *,
    features: tuple[int, ...] = (16, 32, 64, 128, 256, 512),
    dim: int = 64,
    keys: int = 256,
    seeds: int = 5,
    input_std: float = BERT_INIT_STD,
    variants: tuple[KernelVariant, ...] = KERNEL_VARIANTS,
    progress: Callable[[str], None] | None = None,
) -> list[KernelRow]:
    """Every variant at every M, on ``keys`` queries and ``keys`` keys per seed."""
    rows = []
    for variant in variants:
        if progress is not None:
            progress(variant.label)
        for m in features:
            errors = []
            for seed in range(seeds):
                g = torch.Generator().manual_seed(seed)
                q, k = (input_std * torch.randn(keys, dim, generator=g, dtype=torch.float64)
                        for _ in range(2))  # fmt: skip
                errors.append(kernel_errors(variant, m, q, k, seed=10_000 + seed))
            (mse, mse_sem), (rel, rel_sem) = (_mean_sem([e[i] for e in errors]) for i in (0, 1))
            rows.append(KernelRow(variant.label, variant.feature_map, variant.kernel, m,
                                  mse, mse_sem, rel, rel_sem, seeds))  # fmt: skip
    return rows


def _mean_sem(values: list[float]) -> tuple[float, float]:
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.mean(values), sem


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``log y`` against ``log x`` (−1 for an error ∝ 1/M)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-300)) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else 0.0


def kernel_markdown(rows: list[KernelRow]) -> str:
    """Two tables (relative MSE, then MSE): variants down, M across, and the log-log slope
    of the error against M."""
    ms = sorted({r.features for r in rows})
    variants = list(dict.fromkeys(r.variant for r in rows))
    lines = []
    for title, value, sem in (
        ("relative MSE, mean (K̂ − K)² / mean K²", "rel_mse", "rel_mse_sem"),
        ("MSE, mean (K̂ − K)²", "mse", "mse_sem"),
    ):
        lines += [
            f"**{title}** (± standard error over {rows[0].seeds} seeds)",
            "",
            "| feature map | kernel | " + " | ".join(f"M={m}" for m in ms) + " | slope |",
            "|---|---|" + "---|" * (len(ms) + 1),
        ]
        for variant in variants:
            cells = {r.features: r for r in rows if r.variant == variant}
            mine = [cells[m] for m in ms if m in cells]
            slope = loglog_slope([r.features for r in mine], [getattr(r, value) for r in mine])
            text = [
                f"{getattr(cells[m], value):.3g} ± {getattr(cells[m], sem):.1g}"
                if m in cells
                else "—"
                for m in ms
            ]
            lines.append(
                f"| {variant} | {mine[0].kernel} | " + " | ".join(text) + f" | {slope:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_kernel(rows: list[KernelRow], path: Path, caption: str = "") -> Path | None:
    """Relative MSE and MSE against M (log-log), one line per variant (colour of its
    mechanism; dashed for iid sampling), a dotted ``∝ 1/M`` guide. None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.0))
    ms = sorted({r.features for r in rows})
    for ax, value, sem, label in (
        (axes[0], "rel_mse", "rel_mse_sem", "relative MSE  mean (K̂ − K)² / mean K²"),
        (axes[1], "mse", "mse_sem", "MSE  mean (K̂ − K)²  (dimensionless)"),
    ):
        for variant in dict.fromkeys(r.variant for r in rows):
            mine = sorted((r for r in rows if r.variant == variant), key=lambda r: r.features)
            name = mine[0].feature_map
            ax.errorbar([r.features for r in mine], [getattr(r, value) for r in mine],
                        yerr=[getattr(r, sem) for r in mine], marker="o", markersize=3,
                        capsize=2, color=mechanism_color(_COLOR_OF.get(name, name)),
                        linestyle="--" if variant.endswith("-iid") else "-",
                        label=variant)  # fmt: skip
        top = max(getattr(r, value) for r in rows if r.features == ms[0])
        ax.plot(ms, [2 * top * ms[0] / m for m in ms], ":", color="grey", label="∝ 1/M")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("number of features M (output dimension of φ)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("relative to the kernel's size", fontsize=10)
    axes[1].set_title("absolute", fontsize=10)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save_figure(fig, path, caption)
