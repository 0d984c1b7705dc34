"""Random-feature maps whose kernel estimates ``exp(x·y)``: PRF (FAVOR+) and TRF.

* ``prf`` — positive random features (Choromanski et al. 2021; Luo et al. 2021 eq. 5):
  ``φ(x) = exp(Wx − ‖x‖²/2) / √M``, all positive, ``E[φ(x)·φ(y)] = exp(x·y)``.
* ``trf`` — trigonometric random features (Rahimi & Recht 2007; RFA, Peng et al. 2021;
  Luo et al. 2021 eq. 4): ``φ(x) = exp(‖x‖²/2) / √(M/2) · [sin(Wx), cos(Wx)]`` with M/2 frequencies;
  signed, so its normaliser can approach 0.

Both return bounded values and a per-row log-scale (see :class:`~kattn.features.Features`),
so inputs with ‖x‖ ≈ 50 stay finite in fp32 and bf16.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..functional.numerics import exp_floor
from .base import Features, ResampledFeatureMap, register_feature_map, replace_buffer
from .sampling import SAMPLINGS, sample_projection


class RandomFeatureMap(ResampledFeatureMap):
    """A feature map with a random projection ``W`` (buffer, so ``state_dict`` reproduces it).

    Args:
        num_features: M, the number of output features.
        sampling: ``"orthogonal"`` (default), ``"gaussian"`` or ``"sphere"``.
        redraw: ``"never"`` or N: draw a fresh ``W`` every N training forwards. Features are
            frozen in ``eval()`` and in recurrent steps.
        generator: a ``torch.Generator`` for the draws (default: torch's global RNG).
    """

    approximates_softmax = True
    softmax_scaling = True
    projection: Tensor
    #: ``num_features`` must be a multiple of this (features per random frequency).
    features_per_frequency = 1

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int = 256,
        sampling: str = "orthogonal",
        redraw: str | int = 1000,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            every=redraw,
            option="redraw",
            generator=generator,
        )
        per = self.features_per_frequency
        if (
            isinstance(num_features, bool)
            or not isinstance(num_features, int)
            or num_features < per
            or num_features % per
        ):
            raise ValueError(
                f"num_features must be a positive int"
                f"{f' multiple of {per}' if per > 1 else ''}, got {num_features!r}"
            )
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
        self._num_features = num_features
        self.sampling = sampling
        self.register_buffer("projection", self._draw())

    @property
    def num_features(self) -> int:
        return self._num_features

    @property
    def redraw(self) -> str | int:
        """``"never"`` or N: training forwards between draws of ``W`` (read-only)."""
        return self.every

    @property
    def num_projections(self) -> int:
        """Rows of ``W``."""
        return self._num_features // self.features_per_frequency

    def _draw(self) -> Tensor:
        return sample_projection(self.sampling, self.num_projections, self.head_dim, self.generator)

    def _redraw(self) -> None:
        replace_buffer(self, "projection", self._draw())

    def _project(self, x: Tensor, scale: float) -> Tensor:
        """``W (√scale·x)``, (B, H, L, M), with the scale folded into the small ``W``."""
        w = self.projection.to(x.dtype)
        w = w if scale == 1.0 else w * math.sqrt(scale)
        # one (B·H·L, D) × (D, M) product: a head-strided x (a decoding step's query) would
        # otherwise become a batched product over B·H copies of W
        return (x.reshape(-1, x.shape[-1]) @ w.T).view(*x.shape[:-1], w.shape[0])

    def extra_repr(self) -> str:
        return (
            f"num_features={self.num_features}, sampling={self.sampling!r}, redraw={self.redraw!r}"
        )


class PositiveRandomFeatures(RandomFeatureMap):
    """PRF / FAVOR+: ``φ(x) = exp(Wx − ‖x‖²/2) / √M`` (positive; unbiased for ``exp(x·y)``)."""

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        return positive_features(self._project(x, scale), x, scale)

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        return positive_values(self._project(x, scale))[0]


class TrigonometricRandomFeatures(RandomFeatureMap):
    """TRF: ``φ(x) = exp(‖x‖²/2) / √(M/2) · [sin(Wx), cos(Wx)]`` with M/2 frequencies."""

    positive = False
    features_per_frequency = 2  # a sin and a cos per frequency

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        log_scale = (0.5 * scale) * squared_norm(x) - 0.5 * math.log(self.num_projections)
        return Features(self.query_values(x, scale), log_scale)

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        u = self._project(x, scale)
        return torch.cat([torch.sin(u), torch.cos(u)], dim=-1)


def positive_values(u: Tensor) -> tuple[Tensor, Tensor]:
    """``exp(u − max_m u_m)`` (at most 1) and the row maximum ``(..., 1)``, which carries no
    gradient: it cancels between the values and the log-scale.

    ``u`` (projections ``ω_m·x``, ``(..., P)``) is overwritten: it must be the fresh output of
    an operation whose backward does not need it (a matmul or a product), so nothing is copied.
    """
    top = u.detach().amax(dim=-1, keepdim=True)
    u = u.sub_(top)
    # The floor only spares exp slow subnormal results. Outside autograd it keeps no masks for
    # backward (about 15% of a Performer training step); the gradient it leaves below the
    # floor is exp(floor) < 1e-37 instead of 0.
    with torch.no_grad():
        u.clamp_(exp_floor(u.dtype), 0.0)
    return u.exp_(), top


def positive_features(u: Tensor, x: Tensor, scale: float) -> Features:
    """Positive random features ``exp(u − scale·‖x‖²/2) / √P`` of projections ``u = ω·√scale·x``
    ``(..., P)`` (overwritten, see :func:`positive_values`) in bounded form."""
    values, top = positive_values(u)
    log_scale = top[..., 0] - (0.5 * scale) * squared_norm(x) - 0.5 * math.log(u.shape[-1])
    return Features(values, log_scale)


def squared_norm(x: Tensor) -> Tensor:
    """``‖x‖²`` over the last dim, without an (L, D) temporary."""
    return torch.linalg.vector_norm(x, dim=-1).square()


register_feature_map("prf", PositiveRandomFeatures)
register_feature_map("trf", TrigonometricRandomFeatures)
