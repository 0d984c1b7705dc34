"""Presets of kernelized attention with learned feature maps: the KL-Transformer spectra
("On Learning the Transformer Kernel") and the feed-forward kernels of Yorsh 2022 §4.1. Each is
``kernelized(feature_map=NAME)``, so it composes with causal, recurrent and ``rpe=`` forms.

Plot colours are tab20b / tab20c hues: one hue per spectral family, light for RKS and dark for
PRF; reds and purples for the feed-forward kernels. Learned frequencies start from N(0, I), so
the PRF forms of GMM and FastFood estimate softmax up to a small bias at initialisation (GMM's
random means μ_c ~ U(±1/√D), FastFood's only approximately Gaussian rows); the RKS forms (cos/sin
features of a shift-invariant kernel inside a row-normalised attention) and the generator's
frequencies tanh(g(n)) estimate no exact attention.
"""

from __future__ import annotations

from typing import Any

from ..registry import register_mechanism
from .kernelized import KernelizedAttention

_KL = "Chowdhury et al., On Learning the Transformer Kernel (KL-Transformer), TMLR 2022"
_THESIS = (
    "Yorsh, The Study of Linear Self-Attention Mechanism in Transformer, CTU Prague 2022, §4.1"
)
_FEEDFORWARD_COMPLEXITY = (
    "O(L·(C + M·Dv)) with C the cost of the per-head network (O(D·M) per layer); "
    "O(M·Dv) per recurrent step"
)

#: name → the registration's summary, complexity, colour (and counterpart where it has one)
_SPECTRAL: dict[str, dict[str, Any]] = {
    "gmm_rks": dict(
        summary=(
            "GMM-RKS: cos/sin random features whose frequencies come from a learned mixture "
            "of Gaussians (full covariances, per head)."
        ),
        complexity=(
            "O(L·M·(D+Dv)) for M frequencies (M/C per component); O(M·Dv) per recurrent step"
        ),
        colour="#9c9ede",
    ),
    "gmm_prf": dict(
        summary=(
            "GMM-PRF: positive random features whose frequencies come from a learned mixture "
            "of diagonal Gaussians (per head)."
        ),
        complexity="O(L·M·(D+Dv)); O(M·Dv) per recurrent step",
        approximates="softmax",
        colour="#393b79",
    ),
    "fastfood_rks": dict(
        summary=(
            "FastFood-RKS: cos/sin features over learned FastFood frequencies S·H·G·Π·H·B "
            "(fast Walsh-Hadamard transform, no D×M matrix)."
        ),
        complexity="O(L·M·(log D + Dv)); O(M·Dv) per recurrent step",
        colour="#b5cf6b",
    ),
    "fastfood_prf": dict(
        summary=(
            "FastFood-PRF: positive random features over learned FastFood frequencies "
            "S·H·G·Π·H·B (fast Walsh-Hadamard transform)."
        ),
        complexity="O(L·M·(log D + Dv)); O(M·Dv) per recurrent step",
        approximates="softmax",
        colour="#637939",
    ),
    "generative_rks": dict(
        summary=(
            "Generative-RKS: cos/sin features whose frequencies a generator network makes "
            "from Gaussian noise."
        ),
        complexity=(
            "O(L·M·(D+Dv)) plus the generator on M noise vectors; O(M·Dv) per recurrent step"
        ),
        colour="#e7ba52",
    ),
    "generative_prf": dict(
        summary=(
            "Generative-PRF: positive random features whose frequencies a generator network "
            "makes from Gaussian noise."
        ),
        complexity=(
            "O(L·M·(D+Dv)) plus the generator on M noise vectors; O(M·Dv) per recurrent step"
        ),
        colour="#8c6d31",
    ),
}
#: name → the registration's summary and colour
_FEEDFORWARD: dict[str, dict[str, Any]] = {
    "ffk_linear": dict(
        summary="Feed-forward kernel φ = softplus(xW), orthogonal init and penalty.",
        colour="#843c39",
    ),
    "ffk_fcnn": dict(
        summary="Feed-forward kernel φ = softplus(FCNN(x)W), orthogonal init and penalty.",
        colour="#ad494a",
    ),
    "ffk_glu": dict(
        summary="Feed-forward kernel of stacked GLUs, φ = softplus(xW_t)⊙σ(xW_g).", colour="#d6616b"
    ),
    "ffk_oglu": dict(
        summary="Feed-forward kernel of GLUs with the orthogonality penalty on W_t (OGLU).",
        colour="#e7969c",
    ),
    "ffk_aoglu": dict(
        summary="OGLU feed-forward kernel whose gate is a rank-D/4 product (AOGLU).",
        colour="#7b4173",
    ),
    "ffk_ae": dict(
        summary=(
            "Autoencoder feed-forward kernel: φ is the code, the reconstruction loss joins "
            "regularization_loss()."
        ),
        colour="#a55194",
    ),
    "ffk_vae": dict(
        summary="Variational feed-forward kernel (the thesis reports it fails to train).",
        colour="#ce6dbd",
    ),
}

for _name, _entry in _SPECTRAL.items():
    register_mechanism(
        _name,
        KernelizedAttention,
        defaults={"feature_map": _name},
        reference=_KL,
        size_option="num_features",
        **_entry,
    )

for _name, _entry in _FEEDFORWARD.items():
    register_mechanism(
        _name,
        KernelizedAttention,
        defaults={"feature_map": _name},
        reference=_THESIS,
        complexity=_FEEDFORWARD_COMPLEXITY,
        size_option="num_features",
        **_entry,
    )
