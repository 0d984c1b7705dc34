"""Presets of kernelized attention with learned feature maps: the KL-Transformer spectra
("On Learning the Transformer Kernel") and the feed-forward kernels of Yorsh 2022 §4.1. Each is
``kernelized(feature_map=NAME)``, so it composes with causal, recurrent and ``rpe=`` forms."""

from __future__ import annotations

from ..registry import register_mechanism
from .kernelized import KernelizedAttention

_KL = "Chowdhury et al., On Learning the Transformer Kernel (KL-Transformer), TMLR 2022"
_THESIS = (
    "Yorsh, The Study of Linear Self-Attention Mechanism in Transformer, CTU Prague 2022, §4.1"
)

_SPECTRAL = {
    "gmm_rks": (
        "GMM-RKS: cos/sin random features whose frequencies come from a learned mixture of "
        "Gaussians (full covariances, per head).",
        "O(L·M·(D+Dv)) for M frequencies (M/C per component); O(M·Dv) per recurrent step",
    ),
    "gmm_prf": (
        "GMM-PRF: positive random features whose frequencies come from a learned mixture of "
        "diagonal Gaussians (per head).",
        "O(L·M·(D+Dv)); O(M·Dv) per recurrent step",
    ),
    "fastfood_rks": (
        "FastFood-RKS: cos/sin features over learned FastFood frequencies S·H·G·Π·H·B "
        "(fast Walsh-Hadamard transform, no D×M matrix).",
        "O(L·M·(log D + Dv)); O(M·Dv) per recurrent step",
    ),
    "fastfood_prf": (
        "FastFood-PRF: positive random features over learned FastFood frequencies "
        "S·H·G·Π·H·B (fast Walsh-Hadamard transform).",
        "O(L·M·(log D + Dv)); O(M·Dv) per recurrent step",
    ),
    "generative_rks": (
        "Generative-RKS: cos/sin features whose frequencies a generator network makes from "
        "Gaussian noise.",
        "O(L·M·(D+Dv)) plus the generator on M noise vectors; O(M·Dv) per recurrent step",
    ),
    "generative_prf": (
        "Generative-PRF: positive random features whose frequencies a generator network makes "
        "from Gaussian noise.",
        "O(L·M·(D+Dv)) plus the generator on M noise vectors; O(M·Dv) per recurrent step",
    ),
}

#: plot colours (tab20b / tab20c hues): one hue per spectral family, light for RKS, dark for
#: PRF; reds and purples for the feed-forward kernels
_COLOURS = {
    "gmm_prf": "#393b79",
    "gmm_rks": "#9c9ede",
    "fastfood_prf": "#637939",
    "fastfood_rks": "#b5cf6b",
    "generative_prf": "#8c6d31",
    "generative_rks": "#e7ba52",
    "ffk_linear": "#843c39",
    "ffk_fcnn": "#ad494a",
    "ffk_glu": "#d6616b",
    "ffk_oglu": "#e7969c",
    "ffk_aoglu": "#7b4173",
    "ffk_ae": "#a55194",
    "ffk_vae": "#ce6dbd",
}
#: learned frequencies start from N(0, I): the PRF forms estimate softmax up to a small bias
#: (GMM's random means μ_c ~ U(±1/√D), FastFood's only approximately Gaussian rows); the RKS
#: forms (cos/sin features of a shift-invariant kernel inside a row-normalised attention) and
#: the generator's frequencies tanh(g(n)) estimate no exact attention
_APPROXIMATES = {"gmm_prf": "softmax", "fastfood_prf": "softmax"}

_FEEDFORWARD = {
    "ffk_linear": "Feed-forward kernel φ = softplus(xW), orthogonal init and penalty.",
    "ffk_fcnn": "Feed-forward kernel φ = softplus(FCNN(x)W), orthogonal init and penalty.",
    "ffk_glu": "Feed-forward kernel of stacked GLUs, φ = softplus(xW_t)⊙σ(xW_g).",
    "ffk_oglu": "Feed-forward kernel of GLUs with the orthogonality penalty on W_t (OGLU).",
    "ffk_aoglu": "OGLU feed-forward kernel whose gate is a rank-D/4 product (AOGLU).",
    "ffk_ae": "Autoencoder feed-forward kernel: φ is the code, the reconstruction loss joins "
    "regularization_loss().",
    "ffk_vae": "Variational feed-forward kernel (the thesis reports it fails to train).",
}

for _name, (_summary, _complexity) in _SPECTRAL.items():
    register_mechanism(
        _name,
        KernelizedAttention,
        defaults={"feature_map": _name},
        summary=_summary,
        reference=_KL,
        complexity=_complexity,
        approximates=_APPROXIMATES.get(_name),
        size_option="num_features",
        colour=_COLOURS[_name],
    )

for _name, _summary in _FEEDFORWARD.items():
    register_mechanism(
        _name,
        KernelizedAttention,
        defaults={"feature_map": _name},
        summary=_summary,
        reference=_THESIS,
        complexity="O(L·(C + M·Dv)) with C the cost of the per-head network (O(D·M) per "
        "layer); O(M·Dv) per recurrent step",
        size_option="num_features",
        colour=_COLOURS[_name],
    )
