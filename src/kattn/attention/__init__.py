"""Attention mechanisms, one module per family; importing registers them."""

from .base import Attention
from .gaussian import GaussianAttention
from .kernelized import KernelizedAttention
from .linformer import LinformerAttention
from .nystromformer import NystromformerAttention
from .skyformer import SkyformerAttention
from .softmax import SoftmaxAttention

__all__ = [
    "Attention",
    "GaussianAttention",
    "KernelizedAttention",
    "LinformerAttention",
    "NystromformerAttention",
    "SkyformerAttention",
    "SoftmaxAttention",
]
