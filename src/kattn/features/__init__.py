"""Feature maps φ for kernelized attention, each registered by name.

``kattn.features.available()`` lists them; any of them is usable as
``kattn.build("kernelized", feature_map=NAME, **its_options)``.
"""

from . import random_features as _random_features  # noqa: F401  (registers prf, trf)
from . import simple as _simple  # noqa: F401  (registers elu, relu, identity)
from .base import (
    FeatureMap,
    Features,
    available,
    build,
    option_names,
    register_feature_map,
)
from .random_features import PositiveRandomFeatures, RandomFeatureMap, TrigonometricRandomFeatures
from .simple import EluFeatureMap, IdentityFeatureMap, ReluFeatureMap

__all__ = [
    "EluFeatureMap",
    "FeatureMap",
    "Features",
    "IdentityFeatureMap",
    "PositiveRandomFeatures",
    "RandomFeatureMap",
    "ReluFeatureMap",
    "TrigonometricRandomFeatures",
    "available",
    "build",
    "option_names",
    "register_feature_map",
]
