"""Modules built on the mechanisms: the drop-in multi-head attention and ``patch``."""

from .multihead import MultiheadAttention
from .patch import patch

__all__ = ["MultiheadAttention", "patch"]
