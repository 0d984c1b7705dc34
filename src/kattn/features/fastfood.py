"""FastFood-RKS / FastFood-PRF (KL-Transformer eqs. 6, 12; Le et al., ICML 2013; Yang et al. 2015).

The frequency matrix is never formed: per block of d frequencies (d = the head dim rounded up
to a power of two; x is zero-padded, not refused),

    V x = (1 / (σ√d)) · S H G Π H B x,

with H the d×d Walsh–Hadamard matrix applied by the fast transform (O(d log d)), Π a random
permutation, B a diagonal of ±1, G a diagonal of N(0, 1) entries and S a diagonal scaling whose
entries ``s_i / ‖G‖`` (``s_i ~ χ_d``) give the rows the norms of Gaussian vectors (the module
holds ``s`` as ``scaling`` and divides by the norm of the current G, so a redrawn G keeps the
row norms), so each row of V is distributed much like ``N(0, I/σ²)`` and the ``rks`` form
estimates the Gaussian kernel ``exp(−‖x−y‖²/(2σ²))``. M > d stacks independent blocks (the
last one cut to M rows).

``learn``: ``"sgb"`` (default, the paper's main setting) learns S, G and B; ``"s"`` only S;
``"none"`` nothing (Appendix C). What is not learned is redrawn with the noise schedule; Π is
always redrawn. O(L·M·log d) per map, O(M) parameters per head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.hadamard import hadamard_transform, next_power_of_two
from .base import register_feature_map, replace_buffer
from .spectral import SpectralFeatureMap, SpectralPRF, SpectralRKS, upcast

#: ``learn`` options: which diagonals are learned parameters.
LEARN = {"sgb": ("scaling", "gaussian", "signs"), "s": ("scaling",), "none": ()}


class FastFoodFeatures(SpectralFeatureMap):
    """FastFood frequencies ``V = S H G Π H B / (σ√d)`` in blocks, per head; the forms are
    :class:`FastFoodRKS` and :class:`FastFoodPRF`.

    Args:
        num_features: M frequencies (Table 5: 64 for ListOps with d = 64, one block).
        learn: ``"sgb"``, ``"s"`` or ``"none"``.
        sigma: σ, the bandwidth of the kernel at the initial density.
        resample_every, generator: see :class:`~kattn.features.spectral.SpectralFeatureMap`.
    """

    permutation: Tensor
    signs: Tensor  # parameters or buffers, as ``learn`` says
    gaussian: Tensor
    scaling: Tensor

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int = 64,
        learn: str = "sgb",
        sigma: float = 1.0,
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
        if learn not in LEARN:
            raise ValueError(f"learn must be one of {', '.join(LEARN)}, got {learn!r}")
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a positive number, got {sigma!r}")
        self.learn = learn
        self.sigma = float(sigma)
        self.block = next_power_of_two(head_dim)
        self.blocks = -(-num_features // self.block)
        draws = self._draw()
        for name, value in draws.items():
            if name in LEARN[learn]:
                setattr(self, name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)

    def _draw(self) -> dict[str, Tensor]:
        shape = (self.num_heads, self.blocks, self.block)
        g = self.generator
        signs = torch.randint(0, 2, shape, generator=g).float().mul_(2).sub_(1)
        gaussian = torch.randn(shape, generator=g)
        scaling = torch.randn((*shape, self.block), generator=g).norm(dim=-1)  # s_i ~ χ_d
        order = torch.rand(shape, generator=g).argsort(dim=-1)  # a uniform permutation per block
        return {"signs": signs, "gaussian": gaussian, "scaling": scaling, "permutation": order}

    def _redraw(self) -> None:
        for name, value in self._draw().items():
            if name not in LEARN[self.learn]:
                replace_buffer(self, name, value)

    def project(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``V(√scale·x)``, ``(B, H, L, M)``, by two fast Walsh–Hadamard transforms."""
        d, m = self.block, self.samples
        if x.shape[-1] < d:
            x = F.pad(x, (0, d - x.shape[-1]))
        signs, gaussian, scaling = (  # (H, 1, blocks, d): broadcast over the L tokens
            getattr(self, n).to(x.dtype)[:, None] for n in ("signs", "gaussian", "scaling")
        )
        y = hadamard_transform(x[..., None, :] * signs)  # H B x: (B, H, L, blocks, d)
        y = y.gather(-1, self.permutation[:, None].expand(y.shape))  # Π
        y = hadamard_transform(y * gaussian)  # H G Π H B x
        norm = gaussian.norm(dim=-1, keepdim=True)  # S = diag(s) / ‖G‖, ‖G‖ of the current G
        y = y * (scaling * (math.sqrt(scale) / (self.sigma * math.sqrt(d))) / norm)
        y = y.flatten(-2)
        return y if y.shape[-1] == m else y[..., :m]

    def frequencies(self) -> Tensor:
        """The explicit ``V (H, M, D)`` (for analysis; the forward never forms it), in fp32 for
        half-precision parameters as the forward computes it."""
        like = upcast(self.gaussian)
        eye = torch.eye(self.head_dim, device=like.device, dtype=like.dtype)
        eye = eye.expand(1, self.num_heads, self.head_dim, self.head_dim)
        return self.project(eye)[0].transpose(-1, -2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, learn={self.learn!r}, sigma={self.sigma:g}"


class FastFoodRKS(SpectralRKS, FastFoodFeatures):
    """FastFood-RKS (KL-Transformer eq. 6): ``[cos(Vx), sin(Vx)] / √M``, 2M features."""


class FastFoodPRF(SpectralPRF, FastFoodFeatures):
    """FastFood-PRF (KL-Transformer eq. 12): ``exp(Vx − ‖x‖²/2) / √M``, M features."""


register_feature_map("fastfood_rks", FastFoodRKS)
register_feature_map("fastfood_prf", FastFoodPRF)
