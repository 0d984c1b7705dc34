"""Attention mechanisms, one module per family; importing the package imports every module in
it, which registers its mechanisms."""

from ..registry import import_modules
from .base import Attention
from .gaussian import GaussianAttention
from .kernelized import KernelizedAttention
from .linformer import LinformerAttention
from .nystromformer import NystromformerAttention
from .simpletron import SimpletronAttention
from .skyformer import SkyformerAttention
from .softmax import SoftmaxAttention
from .softmax_rpe import RelativeSoftmaxAttention

#: the modules of shared machinery, which register nothing (every other module must register)
SUPPORT_MODULES = (
    "base",
    "encoded",
    "feature_attention",
    "packed",
    "rpe_options",
    "seeded",
    "temperature",
)
MODULES = import_modules(__name__, __path__)

__all__ = [
    "Attention",
    "GaussianAttention",
    "KernelizedAttention",
    "LinformerAttention",
    "NystromformerAttention",
    "RelativeSoftmaxAttention",
    "SimpletronAttention",
    "SkyformerAttention",
    "SoftmaxAttention",
]
