"""kattn: kernelized and efficient attention for PyTorch.

The public API (see the README and docs/):

    kattn.available(), kattn.spec(name)
    kattn.build(name, head_dim=, num_heads=, max_len=, **options) -> kattn.Attention
    kattn.features.available(), kattn.positional.available()
    kattn.MultiheadAttention(embed_dim, num_heads, mechanism=..., **options)
    kattn.patch(model, mechanism=..., **options)
    kattn.convert_attention(model, to, **options) -> kattn.nn.ConversionReport
"""

from . import attention as _attention  # noqa: F401  (registers the mechanisms)
from . import features, functional, positional
from .attention.base import Attention
from .nn import MultiheadAttention, convert_attention, patch
from .registry import MechanismSpec, available, build, spec

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "MechanismSpec",
    "MultiheadAttention",
    "__version__",
    "available",
    "build",
    "convert_attention",
    "features",
    "functional",
    "patch",
    "positional",
    "spec",
]
