"""Modules built on the mechanisms: the drop-in multi-head attention, ``patch``, and the
encoder and classifier of the LRA models."""

from .encoder import EncoderLayer, SequenceClassifier, TransformerEncoder, sinusoidal_positions
from .multihead import MultiheadAttention
from .patch import patch

__all__ = [
    "EncoderLayer",
    "MultiheadAttention",
    "SequenceClassifier",
    "TransformerEncoder",
    "patch",
    "sinusoidal_positions",
]
