"""Feature maps φ for kernelized attention, each registered by name.

``kattn.features.available()`` lists them; any of them is usable as
``kattn.build("kernelized", feature_map=NAME, **its_options)``.
"""

from ..registry import import_modules
from .base import (
    FeatureMap,
    Features,
    ResampledFeatureMap,
    available,
    build,
    get,
    option_names,
    register_feature_map,
)
from .fastfood import FastFoodFeatures, FastFoodPRF, FastFoodRKS
from .feedforward import (
    ApproximatedGLUFeedforwardKernel,
    FCNNFeedforwardKernel,
    FeedforwardKernel,
    GLUFeedforwardKernel,
    LinearFeedforwardKernel,
)
from .feedforward_autoencoders import AutoencoderFeedforwardKernel, VariationalFeedforwardKernel
from .generative import GenerativeFeatures, GenerativePRF, GenerativeRKS
from .random_features import PositiveRandomFeatures, RandomFeatureMap, TrigonometricRandomFeatures
from .simple import EluFeatureMap, IdentityFeatureMap, ReluFeatureMap
from .spectral import (
    GaussianMixtureFeatures,
    GaussianMixturePRF,
    GaussianMixtureRKS,
    SpectralFeatureMap,
    SpectralPRF,
    SpectralRKS,
)

#: the modules of shared machinery, which register nothing (every other module must register)
SUPPORT_MODULES = ("base", "sampling")
MODULES = import_modules(__name__, __path__)

__all__ = [
    "ApproximatedGLUFeedforwardKernel",
    "AutoencoderFeedforwardKernel",
    "EluFeatureMap",
    "FCNNFeedforwardKernel",
    "FastFoodFeatures",
    "FastFoodPRF",
    "FastFoodRKS",
    "FeatureMap",
    "Features",
    "FeedforwardKernel",
    "GLUFeedforwardKernel",
    "GaussianMixtureFeatures",
    "GaussianMixturePRF",
    "GaussianMixtureRKS",
    "GenerativeFeatures",
    "GenerativePRF",
    "GenerativeRKS",
    "IdentityFeatureMap",
    "LinearFeedforwardKernel",
    "PositiveRandomFeatures",
    "RandomFeatureMap",
    "ReluFeatureMap",
    "ResampledFeatureMap",
    "SpectralFeatureMap",
    "SpectralPRF",
    "SpectralRKS",
    "TrigonometricRandomFeatures",
    "VariationalFeedforwardKernel",
    "available",
    "build",
    "get",
    "option_names",
    "register_feature_map",
]
