"""Learned spectral feature maps (KL-Transformer, "On Learning the Transformer Kernel"
§2.1): the frequencies Ω of a random-feature map are drawn from a learned spectral density.

Every map has two forms over the same frequencies ``ω_1..ω_P`` (per head), one class each:

* RKS, :class:`SpectralRKS` — random kitchen sinks (Rahimi & Recht 2007; KL-Transformer eq. 3):
  ``φ(x) = [cos(Ωx), sin(Ωx)] / √P`` (2P features), so ``φ(x)·φ(y) = (1/P) Σ_p cos(ω_p·(x−y))``
  estimates the real, shift-invariant kernel whose spectral density the ω are drawn from.
  Signed features: the attention normaliser can approach 0.
* PRF, :class:`SpectralPRF` — positive random features (KL-Transformer eq. 9):
  ``φ(x) = exp(Ωx − ‖x‖²/2) / √P`` (P features, all positive); with ``ω ~ N(0, I)`` this is
  FAVOR+ and estimates ``exp(x·y)``.

A spectrum (GMM here; FastFood and Generative beside it) subclasses
:class:`SpectralFeatureMap` and defines Ω; each registered map joins a form and a spectrum,
``class GaussianMixtureRKS(SpectralRKS, GaussianMixtureFeatures)``, as
:mod:`~kattn.features.random_features` splits PRF and TRF.

The noise behind the frequencies is a buffer (``state_dict`` reproduces it), drawn afresh every
``resample_every`` training forwards (the paper resamples every 100 iterations) and frozen in
``eval()`` and in recurrent steps; the density's parameters are learned by backpropagation.
Kernelized attention scales q and k by ``D^-¼`` each by default, as the released code does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import positive_int
from ..functional.numerics import accumulation_dtype
from .base import (
    Features,
    ResampledFeatureMap,
    register_feature_map,
    replace_buffer,
)
from .random_features import positive_features, positive_values


class SpectralFeatureMap(ResampledFeatureMap):
    """Random features over learned frequencies ``Ω (H, P, D)``: the common base of the
    spectra (which define Ω) and of the two forms (which make features of ``Ωx``).

    Args:
        num_features: M, the paper's number of random samples (Table 5).
        resample_every: ``"never"`` or N: fresh noise every N training forwards (default 100).
        generator: a ``torch.Generator`` for the noise (default: torch's global RNG).
    """

    approximates_softmax = False
    softmax_scaling = True
    fixed_options = ("form",)  # the registered name says it: gmm_rks, gmm_prf, …
    #: ``"rks"`` or ``"prf"``, set by the form class (shown in ``repr``).
    form: str
    #: features per frequency: 2 (cos and sin) for RKS, 1 for PRF.
    features_per_frequency: int

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int,
        resample_every: str | int = 100,
        generator: torch.Generator | None = None,
        form: str | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            every=resample_every,
            option="resample_every",
            generator=generator,
        )
        if form not in (None, self.form):  # only a direct construction can disagree
            raise ValueError(f"{type(self).__name__} is the {self.form!r} form, got {form!r}")
        positive_int("num_features", num_features)
        self.samples = num_features

    def __new__(cls, *args: Any, form: str | None = None, **kwargs: Any) -> Any:
        """A spectrum called with ``form="rks"`` or ``"prf"``
        (``GaussianMixtureFeatures(..., form="prf")``) makes the class that joins that form
        with it (``GaussianMixturePRF``); a spectrum without a form is refused."""
        if cls.spectrum() is cls:
            joined = {c.form: c for c in cls.__subclasses__() if issubclass(c, _FORMS)}
            if form not in joined:
                raise ValueError(
                    f"{cls.__name__} needs form={' or '.join(map(repr, sorted(joined)))} (or "
                    f"use {', '.join(c.__name__ for c in joined.values())}), got {form!r}"
                )
            cls = joined[form]
        return super().__new__(cls)

    @property
    def resample_every(self) -> str | int:
        """``"never"`` or N: training forwards between draws of the noise (read-only)."""
        return self.every

    @property
    def num_frequencies(self) -> int:
        """P, the number of frequencies per head."""
        return self.samples

    @property
    def num_features(self) -> int:
        return self.features_per_frequency * self.num_frequencies

    def frequencies(self) -> Tensor:
        """``Ω (H, P, D)``: a differentiable function of the learned parameters and the noise,
        computed in fp32 when they are in half precision (fp64 stays fp64), as the features
        are: a bf16 Ω would round every frequency, which the signed RKS normaliser can
        amplify into a large change of the output."""
        raise NotImplementedError

    def project(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``Ω(√scale·x)``, ``(B, H, L, P)``, with the scale folded into the small Ω."""
        omega = self.frequencies().to(x.dtype)
        if scale != 1.0:
            omega = omega * math.sqrt(scale)
        return x @ omega.transpose(-1, -2)

    @classmethod
    def spectrum(cls) -> type[SpectralFeatureMap]:
        """The spectrum class of ``cls``: the first in its MRO to define :meth:`frequencies`
        (``GaussianMixtureFeatures`` for ``GaussianMixtureRKS``)."""
        return next(c for c in cls.__mro__ if "frequencies" in vars(c))

    def _get_name(self) -> str:
        # ``repr`` names the spectrum, the form being among the options:
        # ``GaussianMixtureFeatures(form='rks', …)``
        return self.spectrum().__name__

    def extra_repr(self) -> str:
        return (
            f"form={self.form!r}, num_features={self.samples}, "
            f"resample_every={self.resample_every!r}"
        )


class SpectralRKS(SpectralFeatureMap):
    """The RKS form: ``φ(x) = [cos(Ωx), sin(Ωx)] / √P``, 2P signed features (KL-Transformer
    eq. 3; Rahimi & Recht 2007)."""

    form = "rks"
    positive = False
    features_per_frequency = 2  # a cos and a sin per frequency

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        return Features(_cos_sin(self.project(x, scale)), None)

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        return _cos_sin(self.project(x, scale))


class SpectralPRF(SpectralFeatureMap):
    """The PRF form: ``φ(x) = exp(Ωx − ‖x‖²/2) / √P``, P positive features (KL-Transformer
    eq. 9); at the initial density ``N(0, I)`` it estimates softmax's ``exp(x·y)``."""

    form = "prf"
    positive = True
    approximates_softmax = True  # at the initial density N(0, I)
    features_per_frequency = 1

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        return positive_features(self.project(x, scale), x, scale)

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        return positive_values(self.project(x, scale))[0]


_FORMS = (SpectralRKS, SpectralPRF)


def upcast(t: Tensor) -> Tensor:
    """``t`` in its accumulation dtype: fp32 for half precision, else unchanged."""
    return t.to(accumulation_dtype(t.dtype))


def _cos_sin(u: Tensor) -> Tensor:
    """``[cos u, sin u] / √P`` for ``u (..., P)``."""
    out = torch.cat([torch.cos(u), torch.sin(u)], dim=-1)
    return out.mul_(u.shape[-1] ** -0.5)  # in place: cat's backward does not need its output


class GaussianMixtureFeatures(SpectralFeatureMap):
    """GMM-RKS / GMM-PRF (KL-Transformer eqs. 5, 10): the spectral density is a mixture of C
    Gaussians with equal weights, ``ω_{c,m} = Σ_c n_m + μ_c``, ``n_m ~ N(0, I)``, per head.

    M frequencies per head in all, M/C per component (so M means the same cost for every
    spectral map); the forms differ in ``Σ_c`` (:class:`GaussianMixtureRKS`,
    :class:`GaussianMixturePRF`).

    Initialisation: ``Σ_c = I`` (the map starts as the Gaussian kernel for RKS and as
    FAVOR+'s softmax kernel for PRF, up to the means) and ``μ_c ~ U(±1/√D)`` (as the released
    code), which also sets the components apart.

    Args:
        components: C (the paper uses 2).
        num_features: M frequencies per head (Table 5: 256 for ListOps); a multiple of C, and
            of 2C for RKS.
        resample_every, generator: see :class:`SpectralFeatureMap`.
    """

    noise: Tensor
    #: frequencies per noise draw: 2 when they come in ± pairs around the mean (RKS).
    frequencies_per_draw = 1
    #: how a component's frequencies are laid out, for the error on ``num_features``.
    layout = ""

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int = 256,
        components: int = 2,
        resample_every: str | int = 100,
        generator: torch.Generator | None = None,
        form: str | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            resample_every=resample_every,
            generator=generator,
            form=form,
        )
        positive_int("components", components)
        multiple = self.frequencies_per_draw * components
        if num_features % multiple:
            raise ValueError(
                f"num_features must be a multiple of {multiple} for gmm_{self.form} with "
                f"{components} components (M/C frequencies per component{self.layout}), "
                f"got {num_features}"
            )
        self.components = components
        h, c, d = num_heads, components, head_dim
        bound = d**-0.5
        self.mean = nn.Parameter(torch.empty(h, c, d).uniform_(-bound, bound, generator=generator))
        self._init_spread(h, c, d)
        self.register_buffer("noise", self._draw())

    def _init_spread(self, h: int, c: int, d: int) -> None:
        """Create the parameters of ``Σ_c`` (H heads, C components, D dims) at ``Σ_c = I``."""
        raise NotImplementedError

    def _spread(self, n: Tensor, mu: Tensor) -> Tensor:
        """``ω`` of noise ``n (H, C, draws, D)`` and means ``mu (H, C, 1, D)`` (fp32 under half
        precision), ``(H, C, P/C, D)``."""
        raise NotImplementedError

    def _draw(self) -> Tensor:
        draws = self.samples // self.components // self.frequencies_per_draw
        shape = (self.num_heads, self.components, draws, self.head_dim)
        return torch.randn(shape, generator=self.generator)

    def _redraw(self) -> None:
        replace_buffer(self, "noise", self._draw())

    def frequencies(self) -> Tensor:
        n, mu = upcast(self.noise), upcast(self.mean)[:, :, None]  # (H, C, draws, D), (H, C, 1, D)
        omega = self._spread(n, mu)
        return omega.reshape(self.num_heads, self.num_frequencies, self.head_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, components={self.components}"


class GaussianMixtureRKS(SpectralRKS, GaussianMixtureFeatures):
    """GMM-RKS (KL-Transformer eq. 5): full matrices ``Σ_c`` (D×D; the covariance is
    ``Σ_c Σ_cᵀ``) and, to estimate the real kernel ``Σ_c exp(−½ δᵀΣ_cΣ_cᵀδ) cos(μ_c·δ) / C``
    with low variance, frequencies in pairs ``Σ_c n ± μ_c`` sharing their noise; 2M features."""

    frequencies_per_draw = 2
    layout = ", in ± pairs around its mean"
    scale_matrix: nn.Parameter

    def _init_spread(self, h: int, c: int, d: int) -> None:
        self.scale_matrix = nn.Parameter(torch.eye(d).expand(h, c, d, d).clone())

    def _spread(self, n: Tensor, mu: Tensor) -> Tensor:
        spread = n @ upcast(self.scale_matrix).transpose(-1, -2)  # Σ_c n
        return torch.cat([spread + mu, spread - mu], dim=2)


class GaussianMixturePRF(SpectralPRF, GaussianMixtureFeatures):
    """GMM-PRF (KL-Transformer eq. 10): diagonal ``Σ_c = diag(exp(½ log-variance))``, as the
    paper says for speed; M features."""

    log_variance: nn.Parameter

    def _init_spread(self, h: int, c: int, d: int) -> None:
        self.log_variance = nn.Parameter(torch.zeros(h, c, d))

    def _spread(self, n: Tensor, mu: Tensor) -> Tensor:
        return n * torch.exp(0.5 * upcast(self.log_variance))[:, :, None] + mu


register_feature_map("gmm_rks", GaussianMixtureRKS)
register_feature_map("gmm_prf", GaussianMixturePRF)
