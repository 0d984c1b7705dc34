"""Modules built on the mechanisms: the drop-in multi-head attention, ``patch``,
``convert_attention``, and the encoder and classifier of the LRA models, the causal language
model and the encoder–decoder Transformer with its searches."""

from .causal_lm import CausalLM, DecodingState
from .classifiers import DualEncoderClassifier, SequenceClassifier
from .convert import ConversionReport, ModuleConversion, convert_attention
from .encoder import EncoderLayer, TransformerEncoder, sinusoidal_positions
from .generation import generate, sample_next
from .multihead import MultiheadAttention
from .patch import patch
from .seq2seq import Seq2Seq, Seq2SeqState
from .seq2seq_search import beam_search, greedy_decode

__all__ = [
    "CausalLM",
    "ConversionReport",
    "DecodingState",
    "DualEncoderClassifier",
    "EncoderLayer",
    "ModuleConversion",
    "MultiheadAttention",
    "Seq2Seq",
    "Seq2SeqState",
    "SequenceClassifier",
    "TransformerEncoder",
    "beam_search",
    "convert_attention",
    "generate",
    "greedy_decode",
    "patch",
    "sample_next",
    "sinusoidal_positions",
]
