"""Learned spectral feature maps (KL-Transformer, "On Learning the Transformer Kernel"
§2.1): the frequencies Ω of a random-feature map are drawn from a learned spectral density.

Every map has two forms over the same frequencies ``ω_1..ω_P`` (per head):

* ``rks`` — random kitchen sinks (Rahimi & Recht 2007; KL-Transformer eq. 3):
  ``φ(x) = [cos(Ωx), sin(Ωx)] / √P`` (2P features), so ``φ(x)·φ(y) = (1/P) Σ_p cos(ω_p·(x−y))``
  estimates the real, shift-invariant kernel whose spectral density the ω are drawn from.
  Signed features: the attention normaliser can approach 0.
* ``prf`` — positive random features (KL-Transformer eq. 9): ``φ(x) = exp(Ωx − ‖x‖²/2) / √P``
  (P features, all positive); with ``ω ~ N(0, I)`` this is FAVOR+ and estimates ``exp(x·y)``.

The noise behind the frequencies is a buffer (``state_dict`` reproduces it), drawn afresh every
``resample_every`` training forwards (the paper resamples every 100 iterations) and frozen in
``eval()`` and in recurrent steps; the density's parameters are learned by backpropagation.
Kernelized attention scales q and k by ``D^-¼`` each by default, as the released code does.

This module holds the common machinery and GMM; FastFood and Generative live beside it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.numerics import accumulation_dtype
from .base import (
    Features,
    ResampledFeatureMap,
    check_positive_int,
    register_feature_map,
    replace_buffer,
)
from .random_features import positive_features, positive_values

#: the two forms of every spectral map.
FORMS = ("rks", "prf")


class SpectralFeatureMap(ResampledFeatureMap):
    """Random features over learned frequencies ``Ω (H, P, D)``; subclasses define them.

    Args:
        form: ``"rks"`` (cos/sin, 2P features) or ``"prf"`` (positive, P features).
        num_features: M, the paper's number of random samples (Table 5).
        resample_every: ``"never"`` or N: fresh noise every N training forwards (default 100).
        generator: a ``torch.Generator`` for the noise (default: torch's global RNG).
    """

    approximates_softmax = False
    softmax_scaling = True
    fixed_options = ("form",)  # the registered name says it: gmm_rks, gmm_prf, …

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        form: str,
        num_features: int,
        resample_every: str | int = 100,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            every=resample_every,
            option="resample_every",
            generator=generator,
        )
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
        check_positive_int("num_features", num_features)
        self.form = form
        self.positive = form == "prf"
        self.approximates_softmax = self.positive  # at the initial density N(0, I)
        self.samples = num_features

    @property
    def resample_every(self) -> str | int:
        """``"never"`` or N: training forwards between draws of the noise (read-only)."""
        return self.every

    @property
    def num_frequencies(self) -> int:
        """P, the number of frequencies per head."""
        raise NotImplementedError

    @property
    def num_features(self) -> int:
        return 2 * self.num_frequencies if self.form == "rks" else self.num_frequencies

    def frequencies(self) -> Tensor:
        """``Ω (H, P, D)``: a differentiable function of the learned parameters and the noise,
        computed in fp32 when they are in half precision (fp64 stays fp64), as the features
        are: a bf16 Ω would round every frequency, which the signed ``rks`` normaliser can
        amplify into a large change of the output."""
        raise NotImplementedError

    def project(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``Ω(√scale·x)``, ``(B, H, L, P)``, with the scale folded into the small Ω."""
        omega = self.frequencies().to(x.dtype)
        if scale != 1.0:
            omega = omega * math.sqrt(scale)
        return x @ omega.transpose(-1, -2)

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        u = self.project(x, scale)
        if self.form == "prf":
            return positive_features(u, x, scale)
        return Features(_cos_sin(u), None)

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        u = self.project(x, scale)
        return positive_values(u)[0] if self.form == "prf" else _cos_sin(u)

    def extra_repr(self) -> str:
        return (
            f"form={self.form!r}, num_features={self.samples}, "
            f"resample_every={self.resample_every!r}"
        )


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
    spectral map). ``rks``: full matrices ``Σ_c`` (D×D; the covariance is ``Σ_c Σ_cᵀ``) and,
    to estimate the real kernel ``Σ_c exp(−½ δᵀΣ_cΣ_cᵀδ) cos(μ_c·δ) / C`` with low variance,
    the frequencies come in pairs ``Σ_c n ± μ_c`` sharing their noise; 2M features. ``prf``:
    diagonal ``Σ_c = diag(exp(½ log-variance))`` as the paper says for speed; M features.

    Initialisation: ``Σ_c = I`` (the map starts as the Gaussian kernel for ``rks`` and as
    FAVOR+'s softmax kernel for ``prf``, up to the means) and ``μ_c ~ U(±1/√D)`` (as the released
    code), which also sets the components apart.

    Args:
        components: C (the paper uses 2).
        num_features: M frequencies per head (Table 5: 256 for ListOps); a multiple of C, and
            of 2C for ``rks``.
        form, resample_every, generator: see :class:`SpectralFeatureMap`.
    """

    noise: Tensor

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        form: str,
        num_features: int = 256,
        components: int = 2,
        resample_every: str | int = 100,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            form=form,
            num_features=num_features,
            resample_every=resample_every,
            generator=generator,
        )
        check_positive_int("components", components)
        multiple = 2 * components if form == "rks" else components
        if num_features % multiple:
            raise ValueError(
                f"num_features must be a multiple of {multiple} for gmm_{form} with "
                f"{components} components (M/C frequencies per component"
                f"{', in ± pairs around its mean' if form == 'rks' else ''}), got {num_features}"
            )
        self.components = components
        h, c, d = num_heads, components, head_dim
        bound = d**-0.5
        self.mean = nn.Parameter(torch.empty(h, c, d).uniform_(-bound, bound, generator=generator))
        if form == "rks":
            self.scale_matrix = nn.Parameter(torch.eye(d).expand(h, c, d, d).clone())
        else:
            self.log_variance = nn.Parameter(torch.zeros(h, c, d))
        self.register_buffer("noise", self._draw())

    @property
    def num_frequencies(self) -> int:
        return self.samples

    def _draw(self) -> Tensor:
        draws = self.samples // self.components // (2 if self.form == "rks" else 1)
        shape = (self.num_heads, self.components, draws, self.head_dim)
        return torch.randn(shape, generator=self.generator)

    def _redraw(self) -> None:
        replace_buffer(self, "noise", self._draw())

    def frequencies(self) -> Tensor:
        n, mu = upcast(self.noise), upcast(self.mean)[:, :, None]  # (H, C, draws, D), (H, C, 1, D)
        if self.form == "rks":
            spread = n @ upcast(self.scale_matrix).transpose(-1, -2)  # Σ_c n
            omega = torch.cat([spread + mu, spread - mu], dim=2)
        else:
            omega = n * torch.exp(0.5 * upcast(self.log_variance))[:, :, None] + mu
        return omega.reshape(self.num_heads, self.num_frequencies, self.head_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, components={self.components}"


register_feature_map("gmm_rks", GaussianMixtureFeatures, {"form": "rks"})
register_feature_map("gmm_prf", GaussianMixtureFeatures, {"form": "prf"})
