"""Autoencoder feed-forward kernels (Yorsh 2022 §4.1.1): φ is the code of a per-head
(variational) autoencoder of q and k, trained by a reconstruction loss recorded during the
forward and returned by ``regularization_loss()``. See :mod:`kattn.features.feedforward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import in_backward, register_feature_map
from .feedforward import (
    FeedforwardKernel,
    check_weight,
    orthogonal_weight,
    project_heads,
)

#: ``|log σ²|`` bound of the variational kernel.
LOG_VARIANCE_BOUND = 30.0


class _ReconstructingKernel(FeedforwardKernel):
    """A feed-forward kernel trained by a loss recorded during the forward.

    While the module is in training mode every call (queries and keys alike) records a loss;
    :meth:`training_step`, which the owning attention calls at the start of every training
    forward, releases the records of the previous forward. Take :meth:`regularization_loss`
    after the forward and before the next one (the training loop adds it to the task loss).

    Recurrent steps in training mode record too, and nothing releases those records but the
    next training forward: decode in ``eval()``. With activation checkpointing use
    ``use_reentrant=False``: the reentrant form runs the forward without autograd, so its
    record would carry no gradient.
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None,
        reconstruction_weight: float,
        orthogonal_penalty: float,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.reconstruction_weight = check_weight("reconstruction_weight", reconstruction_weight)
        self._recorded: list[Tensor] = []

    def _record(self, loss: Tensor) -> None:
        # A forward that activation checkpointing re-runs inside backward is the same step: its
        # loss was recorded already (the loss is still computed, so that the recomputation
        # saves the same tensors as the forward).
        if not in_backward():
            self._recorded.append(loss)

    def recorded_loss(self) -> Tensor:
        """Mean of the losses recorded since the last :meth:`training_step` (0 if none)."""
        if not self._recorded:
            return torch.zeros((), device=self.transforms()[0].device)
        return torch.stack(self._recorded).mean()

    @torch.compiler.disable
    def training_step(self) -> None:
        if not in_backward():
            self._recorded = []

    def regularization_loss(self) -> Tensor:
        return self.orthogonality_loss() + self.recorded_loss()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, reconstruction_weight={self.reconstruction_weight:g}"


def _reconstruction_error(x_hat: Tensor, x: Tensor) -> Tensor:
    """``‖x̂ − x‖²`` summed over D, averaged over tokens (B, H and L)."""
    return (x_hat - x).square().sum(-1).mean()


class AutoencoderFeedforwardKernel(_ReconstructingKernel):
    """φ is the encoder of an autoencoder of q and k: ``z = φ(x) = softplus(x W_e)`` (D → M),
    ``x̂ = z W_d`` (M → D); cost ``O(L·D·M)`` (twice that in training, for the decoder).

    In training mode each call records ``w · mean_tokens ‖x̂ − x‖²`` (w =
    ``reconstruction_weight``), which :meth:`regularization_loss` adds to the orthogonality
    penalty on ``W_e``; take it after the forward and before the next one (the next training
    forward releases the record).
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        reconstruction_weight: float = 1.0,
        orthogonal_penalty: float = 0.0,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            reconstruction_weight=reconstruction_weight,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.encoder = orthogonal_weight(num_heads, head_dim, self.num_features)  # (H, D, M)
        self.decoder = orthogonal_weight(num_heads, self.num_features, head_dim)  # (H, M, D)

    def transform(self, x: Tensor) -> Tensor:
        z = F.softplus(project_heads(x, self.encoder))  # (B, H, L, M)
        if self.training:
            x_hat = project_heads(z, self.decoder)  # (B, H, L, D)
            self._record(self.reconstruction_weight * _reconstruction_error(x_hat, x))
        return z

    def transforms(self) -> list[Tensor]:
        return [self.encoder]


class VariationalFeedforwardKernel(_ReconstructingKernel):
    """φ from a variational autoencoder of q and k: ``μ = x W_μ``, ``log σ² = x W_s`` (D → M),
    ``z = μ + σ ⊙ ε`` with ``ε ~ N(0, I)`` in training (``z = μ`` in eval), ``φ(x) =
    softplus(z)``, ``x̂ = z W_d`` (M → D); cost ``O(L·D·M)`` (three times that in training).

    In training mode each call records ``w_r · mean_tokens ‖x̂ − x‖² + w_kl · mean_tokens
    KL(N(μ, σ²) ‖ N(0, I))`` (the KL summed over the M latent dims), which
    :meth:`regularization_loss` adds to the orthogonality penalty on ``W_μ``; take it after the
    forward and before the next one. ε comes from torch's global RNG.

    The thesis (Yorsh 2022, Table 4.1, "Variational": FAIL on all three LRA tasks) reports that
    this kernel did not exceed random prediction at any layer count or hidden width, and
    supposes the N(0, I) prior is too strong for the latent code: it is here to reproduce that
    result, not as a recommended map. ``log σ²`` is clamped to ``±LOG_VARIANCE_BOUND`` so that
    σ and the KL term stay finite for any input.
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        reconstruction_weight: float = 1.0,
        kl_weight: float = 1.0,
        orthogonal_penalty: float = 0.0,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            reconstruction_weight=reconstruction_weight,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.kl_weight = check_weight("kl_weight", kl_weight)
        m = self.num_features
        self.mean = orthogonal_weight(num_heads, head_dim, m)  # W_μ (H, D, M)
        self.log_variance = orthogonal_weight(num_heads, head_dim, m)  # W_s (H, D, M)
        self.decoder = orthogonal_weight(num_heads, m, head_dim)  # W_d (H, M, D)

    def transform(self, x: Tensor) -> Tensor:
        mean = project_heads(x, self.mean)  # (B, H, L, M)
        if not self.training:
            return F.softplus(mean)
        # clamped so that σ = exp(½ log σ²) and the KL term stay finite for any input
        log_var = project_heads(x, self.log_variance).clamp(-LOG_VARIANCE_BOUND, LOG_VARIANCE_BOUND)
        # randn, not randn_like: the draw must not depend on the memory layout of the product
        noise = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype)
        z = mean + torch.exp(0.5 * log_var) * noise
        x_hat = project_heads(z, self.decoder)  # (B, H, L, D)
        kl = 0.5 * (mean.square() + log_var.exp() - log_var - 1.0).sum(-1).mean()
        self._record(
            self.reconstruction_weight * _reconstruction_error(x_hat, x) + self.kl_weight * kl
        )
        return F.softplus(z)

    def transforms(self) -> list[Tensor]:
        return [self.mean]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kl_weight={self.kl_weight:g}"


register_feature_map("ffk_ae", AutoencoderFeedforwardKernel)
register_feature_map("ffk_vae", VariationalFeedforwardKernel)
