"""Feature maps φ: the base class and the registry behind ``kernelized(feature_map=...)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..registry import Registry, check_options, keyword_parameters


class Features(NamedTuple):
    """Features in log-space friendly form: ``φ(x) = values · exp(log_scale)``.

    Attributes:
        values: ``(B, H, L, M)``, bounded (at most 1 in absolute value for the built-in maps).
        log_scale: ``(B, H, L)`` per-row log factor, or None when it is 0 everywhere.
    """

    values: Tensor
    log_scale: Tensor | None

    def dense(self) -> Tensor:
        """The plain features ``φ(x)`` (may overflow where ``log_scale`` is large)."""
        if self.log_scale is None:
            return self.values
        return self.values * torch.exp(self.log_scale)[..., None]


class FeatureMap(nn.Module):
    """A map φ: ``(B, H, L, D) → (B, H, L, M)`` with ``κ(x, y) ≈ φ(x)·φ(y)``.

    ``forward(x, scale)`` returns the :class:`Features` of ``√scale · x`` (maps fold the scale
    into their own arithmetic where that saves a pass over x); inputs arrive in fp32 or fp64.
    """

    #: every feature is >= 0, so normalisers are positive.
    positive: bool = True
    #: φ(x)·φ(y) estimates exp(x·y): kernelized attention then scales inputs like softmax.
    approximates_softmax: bool = False
    #: the map draws random parameters (see :meth:`redraw_features`).
    is_random: bool = False

    def __init__(self, *, head_dim: int, num_heads: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = num_heads

    @property
    def num_features(self) -> int:
        """M, the number of features."""
        raise NotImplementedError

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        raise NotImplementedError

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``φ(√scale · x)`` up to a positive factor per row: all a query needs, since that
        factor cancels in the ratio of kernelized attention."""
        return self(x, scale).values

    def features(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """The plain ``φ(√scale · x)`` (for references and plots)."""
        return self(x, scale).dense()

    def training_step(self) -> None:
        """Called once per training forward of the owning attention (redraw schedules)."""

    def regularization_loss(self) -> Tensor:
        """Penalty on the map's parameters (0 unless the map defines one)."""
        tensors = [*self.parameters(), *self.buffers()]
        return torch.zeros((), device=tensors[0].device if tensors else None)


FEATURE_MAPS: Registry[tuple[type[FeatureMap], Mapping[str, Any]]] = Registry("feature map")


def register_feature_map(
    name: str, cls: type[FeatureMap], defaults: Mapping[str, Any] | None = None
) -> None:
    """Register ``cls`` (with preset ``defaults``) as ``feature_map=name``."""
    FEATURE_MAPS.add(name, (cls, dict(defaults or {})))


def available() -> list[str]:
    """Registered feature-map names, sorted."""
    return FEATURE_MAPS.names()


def option_names(name: str) -> list[str]:
    """The options feature map ``name`` accepts."""
    cls, _ = FEATURE_MAPS.get(name)
    return keyword_parameters(cls.__init__, exclude=("head_dim", "num_heads"))


def build(name: str, *, head_dim: int, num_heads: int, **options: Any) -> FeatureMap:
    """Build feature map ``name``; unknown options raise ``TypeError`` naming the valid ones."""
    cls, defaults = FEATURE_MAPS.get(name)
    check_options(f"feature map {name!r}", options, option_names(name))
    return cls(head_dim=head_dim, num_heads=num_heads, **{**defaults, **options})
