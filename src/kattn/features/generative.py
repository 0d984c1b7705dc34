"""Generative-RKS / Generative-PRF (KL-Transformer eqs. 7, 11; Fang et al. 2020): a generator
network maps Gaussian noise to the frequencies, ``ω_m = g(n_m)``, ``n_m ~ N(0, I)``, so the spectral
density is learned implicitly.

``g``: 4 fully connected layers, each with batch normalisation and LeakyReLU, then a fully
connected layer with tanh (the paper's §2.1); one generator per attention layer, shared by its
heads, each head with its own noise. Batch normalisation runs over the P·H noise vectors; in
``eval()`` it uses its running statistics, so features are deterministic there. The generator
runs in fp32 when the module is in half precision (its running statistics are kept in the
module's dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import positive_int
from .base import register_feature_map, replace_buffer
from .spectral import SpectralFeatureMap, SpectralPRF, SpectralRKS, upcast


class GenerativeFeatures(SpectralFeatureMap):
    """Frequencies from a generator network ``g: R^D → (−1, 1)^D``; the forms are
    :class:`GenerativeRKS` and :class:`GenerativePRF`.

    Args:
        num_features: M frequencies per head (Table 5 for ListOps: 256 for ``rks``, 128 for
            ``prf``).
        hidden_dim: width of the generator's hidden layers (default 4·D, the released code's
            width).
        layers: hidden fully connected layers with batch normalisation and LeakyReLU (4).
        resample_every, generator: see :class:`~kattn.features.spectral.SpectralFeatureMap`.
    """

    noise: Tensor

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int = 256,
        hidden_dim: int | None = None,
        layers: int = 4,
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
        hidden = 4 * head_dim if hidden_dim is None else hidden_dim
        positive_int("hidden_dim", hidden)
        positive_int("layers", layers)
        if num_heads * num_features < 2:
            raise ValueError(
                "generative maps need num_heads·num_features >= 2: batch normalisation in the "
                f"generator needs two noise vectors, got {num_heads}·{num_features}"
            )
        self.hidden_dim, self.layers = hidden, layers
        blocks: list[nn.Module] = []
        width = head_dim
        for _ in range(layers):
            # no bias before batch normalisation: it would be removed with the mean
            blocks += [nn.Linear(width, hidden, bias=False), nn.BatchNorm1d(hidden), nn.LeakyReLU()]
            width = hidden
        blocks += [nn.Linear(width, head_dim), nn.Tanh()]
        self.net = nn.Sequential(*blocks)
        for module in self.net:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.register_buffer("noise", self._draw())

    def _draw(self) -> Tensor:
        shape = (self.num_heads * self.samples, self.head_dim)
        return torch.randn(shape, generator=self.generator)

    def _redraw(self) -> None:
        replace_buffer(self, "noise", self._draw())

    def frequencies(self) -> Tensor:
        noise = upcast(self.noise)
        own = {**dict(self.net.named_parameters()), **dict(self.net.named_buffers())}
        wide = {name: upcast(t) if t.is_floating_point() else t for name, t in own.items()}
        if all(wide[name] is t for name, t in own.items()):
            omega = self.net(noise)  # (H·P, D)
        else:  # half precision: the layers and batch statistics in fp32, on upcast copies
            omega = torch.func.functional_call(self.net, wide, (noise,))
            with torch.no_grad():  # running statistics that a training forward updated
                for name, _ in self.net.named_buffers():
                    if wide[name] is not own[name]:
                        own[name].copy_(wide[name])
        return omega.view(self.num_heads, self.samples, self.head_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hidden_dim={self.hidden_dim}, layers={self.layers}"


class GenerativeRKS(SpectralRKS, GenerativeFeatures):
    """Generative-RKS (KL-Transformer eq. 7): ``[cos(Ωx), sin(Ωx)] / √M``, 2M features."""


class GenerativePRF(SpectralPRF, GenerativeFeatures):
    """Generative-PRF (KL-Transformer eq. 11): ``exp(Ωx − ‖x‖²/2) / √M``, M features."""


register_feature_map("generative_rks", GenerativeRKS, {"num_features": 256})
register_feature_map("generative_prf", GenerativePRF, {"num_features": 128})
