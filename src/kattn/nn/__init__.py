"""Modules built on the mechanisms: the drop-in multi-head attention, ``patch``,
``convert_attention``, and the encoder and classifier of the LRA models, the causal language
model, the masked language model (BERT's pre-training) and the text classifier fine-tuned
from it, the encoder–decoder Transformer with its searches, the Vision Transformer and the
pixel-level image generator."""

from .causal_lm import CausalLM, DecodingState
from .classifiers import DualEncoderClassifier, SequenceClassifier
from .convert import ConversionReport, ModuleConversion, convert_attention
from .encoder import EncoderLayer, TransformerEncoder, sinusoidal_positions
from .generation import generate, sample_next
from .image_generator import GENERATOR_PRESETS, ImageGenerator
from .masked_lm import MaskedLM
from .multihead import MultiheadAttention
from .patch import patch
from .seq2seq import Seq2Seq, Seq2SeqState
from .seq2seq_search import beam_search, greedy_decode
from .text_classifier import TextClassifier
from .vision import VIT_PRESETS, VisionTransformer, vision_transformer

__all__ = [
    "GENERATOR_PRESETS",
    "VIT_PRESETS",
    "CausalLM",
    "ConversionReport",
    "DecodingState",
    "DualEncoderClassifier",
    "EncoderLayer",
    "ImageGenerator",
    "MaskedLM",
    "ModuleConversion",
    "MultiheadAttention",
    "Seq2Seq",
    "Seq2SeqState",
    "SequenceClassifier",
    "TextClassifier",
    "TransformerEncoder",
    "VisionTransformer",
    "beam_search",
    "convert_attention",
    "generate",
    "greedy_decode",
    "patch",
    "sample_next",
    "sinusoidal_positions",
    "vision_transformer",
]
