"""Feed-forward kernels: φ learned by a small per-head network (Yorsh 2022 §4.1).

Instead of estimating ``exp(q·k)`` with random features, φ is a network trained with the rest of
the model; its last activation is positive, so the normaliser of kernelized attention is too.
Every map has no biases (they interact badly with the regulariser), orthogonal initial weights,
one set of weights per head (cost ``O(D²/H)`` per token instead of ``O(D²)`` for the whole
width) and hidden width D:

* ``ffk_linear`` — ``φ(x) = softplus(x W)``.
* ``ffk_fcnn`` — ``φ(x) = softplus(FCNN(x) W)``, ``FCNN`` = ``depth`` × (``x W_i``, GELU).
* ``ffk_glu`` / ``ffk_oglu`` — ``depth`` stacked gated linear units,
  ``GLU(X) = X W_t ⊙ σ(X W_g)`` and last ``GLU_out(X) = softplus(X W_t) ⊙ σ(X W_g)``;
  OGLU is GLU with the orthogonality penalty on ``W_t``.
* ``ffk_aoglu`` — OGLU whose gates ``W_g ≈ A B`` have rank ``gate_rank`` (D/4 by default).
* ``ffk_ae`` / ``ffk_vae`` — φ is the (variational) encoder of an autoencoder of q and k,
  trained by a reconstruction loss (the thesis reports that the variational one fails);
  in :mod:`kattn.features.feedforward_autoencoders`.

Regulariser (Yorsh 2022 §4.1.1): ``λ Σ_W Σ_h ‖G_{W,h} − I‖_F²`` over the map's transform
matrices and heads, where G is the Gram matrix of the smaller side of ``W_h`` (``W Wᵀ`` for a
wide W, ``Wᵀ W`` for a tall one), so an orthogonal W of any shape costs 0. It is returned by
``regularization_loss()``, which the training loop adds to the task loss.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import positive_int
from .base import FeatureMap, Features, register_feature_map


def orthogonality_defect(weight: Tensor) -> Tensor:
    """``Σ_h ‖G_h − I‖_F²`` of a per-head weight ``(H, in, out)``: 0 iff every head's matrix has
    orthonormal rows (``in <= out``, ``G = W Wᵀ``) or columns (``in > out``, ``G = Wᵀ W``).

    Computed in at least fp32 (the Gram matrix of fp16 weights loses the small defects).
    """
    w = weight.to(torch.promote_types(weight.dtype, torch.float32))
    wt = w.transpose(-1, -2)
    gram = w @ wt if w.shape[-2] <= w.shape[-1] else wt @ w  # (H, n, n), n = min(in, out)
    eye = torch.eye(gram.shape[-1], device=gram.device, dtype=gram.dtype)
    return (gram - eye).square().sum()


def orthogonal_weight(num_heads: int, fan_in: int, fan_out: int) -> nn.Parameter:
    """A per-head weight ``(H, in, out)``, each head's ``(in, out)`` matrix drawn by
    ``nn.init.orthogonal_`` (from torch's global RNG)."""
    weight = torch.empty(num_heads, fan_in, fan_out)
    for head in weight:
        nn.init.orthogonal_(head)
    return nn.Parameter(weight)


def project_heads(x: Tensor, weight: Tensor) -> Tensor:
    """``x W`` per head: ``(B, H, L, in) @ (H, in, out) → (B, H, L, out)``, in x's dtype."""
    return x @ weight.to(x.dtype)


def strictly_positive(values: Tensor) -> Tensor:
    """Clamp to the smallest normal number: softplus and sigmoid underflow to 0 (and CPU maths
    slows down on subnormals) for very negative inputs, and φ must stay strictly positive."""
    return values.clamp_min(torch.finfo(values.dtype).tiny)


def check_weight(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class FeedforwardKernel(FeatureMap):
    """Base of the feed-forward kernels: ``φ(x) = net(x)`` with a positive last activation.

    Args:
        num_features: M, the output width of the network (default: D, the head dim, as in the
            thesis: no expansion or compression). Hidden layers have width D.
        orthogonal_penalty: λ >= 0 of the orthogonality regulariser on the matrices listed by
            :meth:`transforms`.

    Subclasses build their per-head weights with :func:`orthogonal_weight` and implement
    :meth:`transform` (``(B, H, L, D) → (B, H, L, M)``, >= 0) and :meth:`transforms`.
    """

    positive = True
    approximates_softmax = False

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None,
        orthogonal_penalty: float,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if num_features is not None:
            positive_int("num_features", num_features)
        self._num_features = head_dim if num_features is None else num_features
        self.orthogonal_penalty = check_weight("orthogonal_penalty", orthogonal_penalty)

    @property
    def num_features(self) -> int:
        return self._num_features

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        if x.dim() < 3 or x.shape[-3] != self.num_heads or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x must be (B, H, L, D) with H={self.num_heads} and D={self.head_dim} (the "
                f"map holds weights per head), got {tuple(x.shape)}"
            )
        x = x if scale == 1.0 else x * math.sqrt(scale)
        return Features(strictly_positive(self.transform(x)), None)

    def transform(self, x: Tensor) -> Tensor:
        """The network: ``(B, H, L, D) → (B, H, L, M)``, >= 0 (the clamp to > 0 is shared)."""
        raise NotImplementedError

    def transforms(self) -> list[Tensor]:
        """The per-head matrices ``(H, in, out)`` under the orthogonality penalty."""
        raise NotImplementedError

    def orthogonality_loss(self) -> Tensor:
        """``λ Σ_W Σ_h ‖G_{W,h} − I‖_F²`` over :meth:`transforms` (0 when λ = 0)."""
        weights = self.transforms()
        total = torch.zeros((), device=weights[0].device)
        if self.orthogonal_penalty == 0.0:
            return total
        for weight in weights:
            total = total + orthogonality_defect(weight)
        return self.orthogonal_penalty * total

    def regularization_loss(self) -> Tensor:
        return self.orthogonality_loss()

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"num_features={self.num_features}, orthogonal_penalty={self.orthogonal_penalty:g}"
        )


class LinearFeedforwardKernel(FeedforwardKernel):
    """``φ(x) = softplus(x W)``, W ``(D, M)`` per head; cost ``O(L·D·M)``.

    The "linear kernel" of Yorsh 2022 (§4.1.1, Table 4.1); with the default
    ``orthogonal_penalty=0.1`` it is the "orthogonal linear kernel".
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        orthogonal_penalty: float = 0.1,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.weight = orthogonal_weight(num_heads, head_dim, self.num_features)  # (H, D, M)

    def transform(self, x: Tensor) -> Tensor:
        return F.softplus(project_heads(x, self.weight))

    def transforms(self) -> list[Tensor]:
        return [self.weight]


class FCNNFeedforwardKernel(FeedforwardKernel):
    """``φ(x) = softplus(FCNN(x) W)``, ``FCNN`` = ``depth`` layers ``x ↦ GELU(x W_i)`` (D → D);
    cost ``O(L·D·(depth·D + M))`` (Yorsh 2022 §4.1.1).

    Args:
        depth: number of hidden layers (>= 1).

    The orthogonality penalty covers every hidden ``W_i`` and W.
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        depth: int = 1,
        orthogonal_penalty: float = 0.1,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.depth = positive_int("depth", depth)
        self.hidden = nn.ParameterList(
            orthogonal_weight(num_heads, head_dim, head_dim) for _ in range(depth)
        )  # each (H, D, D)
        self.weight = orthogonal_weight(num_heads, head_dim, self.num_features)  # (H, D, M)

    def transform(self, x: Tensor) -> Tensor:
        for weight in self.hidden:
            x = F.gelu(project_heads(x, weight))
        return F.softplus(project_heads(x, self.weight))

    def transforms(self) -> list[Tensor]:
        return [*self.hidden, self.weight]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, depth={self.depth}"


class GatedLinearUnit(nn.Module):
    """One per-head gated linear unit: ``X W_t ⊙ σ(X W_g)``, or on the last layer
    ``softplus(X W_t) ⊙ σ(X W_g)``; with ``gate_rank`` r, ``W_g = A B`` (A ``(in, r)``,
    B ``(r, out)``), which costs ``O(r·(in + out))`` per token instead of ``O(in·out)``."""

    def __init__(
        self, num_heads: int, fan_in: int, fan_out: int, *, last: bool, gate_rank: int | None
    ) -> None:
        super().__init__()
        self.last = last
        self.transform = orthogonal_weight(num_heads, fan_in, fan_out)  # W_t (H, in, out)
        self.gate: nn.Parameter | None = None
        self.gate_down: nn.Parameter | None = None
        self.gate_up: nn.Parameter | None = None
        if gate_rank is None:
            self.gate = orthogonal_weight(num_heads, fan_in, fan_out)  # W_g (H, in, out)
        else:
            self.gate_down = orthogonal_weight(num_heads, fan_in, gate_rank)  # A (H, in, r)
            self.gate_up = orthogonal_weight(num_heads, gate_rank, fan_out)  # B (H, r, out)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            logits = project_heads(x, self.gate)
        else:
            assert self.gate_down is not None and self.gate_up is not None
            logits = project_heads(project_heads(x, self.gate_down), self.gate_up)
        t = project_heads(x, self.transform)
        return (F.softplus(t) if self.last else t) * torch.sigmoid(logits)


class GLUFeedforwardKernel(FeedforwardKernel):
    """``depth`` stacked gated linear units (Yorsh 2022 §4.1.1):
    ``GLU(X) = X W_t ⊙ σ(X W_g)`` (D → D) on hidden layers and
    ``GLU_out(X) = softplus(X W_t) ⊙ σ(X W_g)`` (→ M) last; cost ``O(L·D·(depth·D + M))``.

    Registered as ``ffk_glu`` (λ = 0) and ``ffk_oglu`` (λ = 0.1: the OGLU of the thesis, whose
    transforms ``W_t`` are kept near orthogonal; the gates are not penalised).

    Args:
        depth: number of GLU layers (>= 1), the last one included.
        gate_rank: None for full gates, or r: every ``W_g`` is the product of per-head
            ``(in, r)`` and ``(r, out)`` matrices (the "approximated" GLU).
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        depth: int = 1,
        gate_rank: int | None = None,
        orthogonal_penalty: float = 0.0,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            orthogonal_penalty=orthogonal_penalty,
        )
        self.depth = positive_int("depth", depth)
        if gate_rank is not None:
            positive_int("gate_rank", gate_rank)
        self.gate_rank = gate_rank
        widths = [head_dim] * depth + [self.num_features]
        self.layers = nn.ModuleList(
            GatedLinearUnit(
                num_heads, widths[i], widths[i + 1], last=i == depth - 1, gate_rank=gate_rank
            )
            for i in range(depth)
        )

    def transform(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def transforms(self) -> list[Tensor]:
        return [cast(GatedLinearUnit, layer).transform for layer in self.layers]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, depth={self.depth}, gate_rank={self.gate_rank}"


class ApproximatedGLUFeedforwardKernel(GLUFeedforwardKernel):
    """AOGLU (Yorsh 2022 §4.1.1): OGLU with low-rank gates ``W_g ≈ A B`` of rank
    ``gate_rank`` (default ``max(1, D // 4)``, the thesis's r = d/4: a quarter fewer parameters
    than GLU); cost ``O(L·depth·D·(D + 2r))``.
    """

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        num_features: int | None = None,
        depth: int = 1,
        gate_rank: int | None = None,
        orthogonal_penalty: float = 0.1,
    ) -> None:
        super().__init__(
            head_dim=head_dim,
            num_heads=num_heads,
            num_features=num_features,
            depth=depth,
            gate_rank=max(1, head_dim // 4) if gate_rank is None else gate_rank,
            orthogonal_penalty=orthogonal_penalty,
        )


register_feature_map("ffk_linear", LinearFeedforwardKernel)
register_feature_map("ffk_fcnn", FCNNFeedforwardKernel)
register_feature_map("ffk_glu", GLUFeedforwardKernel)
register_feature_map("ffk_oglu", GLUFeedforwardKernel, {"orthogonal_penalty": 0.1})
register_feature_map("ffk_aoglu", ApproximatedGLUFeedforwardKernel)
