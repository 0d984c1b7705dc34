"""Deterministic feature maps: elu+1 (Katharopoulos et al. 2020), relu, identity."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from .base import FeatureMap, Features, register_feature_map


class _ElementwiseMap(FeatureMap):
    """φ applied elementwise; M = D."""

    @property
    def num_features(self) -> int:
        return self.head_dim

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        return Features(self.transform(x if scale == 1.0 else x * math.sqrt(scale)), None)

    def transform(self, x: Tensor) -> Tensor:
        raise NotImplementedError


class EluFeatureMap(_ElementwiseMap):
    """``φ(x) = elu(x) + 1`` (> 0): the map of "Transformers are RNNs"."""

    def transform(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0


class ReluFeatureMap(_ElementwiseMap):
    """``φ(x) = relu(x)`` (>= 0; a query whose features are all 0 gets a zero output)."""

    def transform(self, x: Tensor) -> Tensor:
        return F.relu(x)


class IdentityFeatureMap(_ElementwiseMap):
    """``φ(x) = x``: the kernel is ``q·k`` itself, which may be negative (signed normaliser)."""

    positive = False

    def transform(self, x: Tensor) -> Tensor:
        return x


register_feature_map("elu", EluFeatureMap)
register_feature_map("relu", ReluFeatureMap)
register_feature_map("identity", IdentityFeatureMap)
