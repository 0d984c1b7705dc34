"""Modules built on the mechanisms: the drop-in multi-head attention, ``patch``, and the
encoder and classifier of the LRA models, and the causal language model."""

from .causal_lm import CausalLM, DecodingState
from .classifiers import DualEncoderClassifier, SequenceClassifier
from .encoder import EncoderLayer, TransformerEncoder, sinusoidal_positions
from .generation import generate, sample_next
from .multihead import MultiheadAttention
from .patch import patch

__all__ = [
    "CausalLM",
    "DecodingState",
    "DualEncoderClassifier",
    "EncoderLayer",
    "MultiheadAttention",
    "SequenceClassifier",
    "TransformerEncoder",
    "generate",
    "patch",
    "sample_next",
    "sinusoidal_positions",
]
