"""Tiny random transformers models of each family kattn.hf supports (2 layers, hidden 32,
vocabulary 100), made locally: nothing is downloaded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 100
FAMILIES = ("bert", "roberta", "gpt2", "llama", "mistral", "opt", "gpt_neox", "vit")
CAUSAL = ("gpt2", "llama", "mistral", "opt", "gpt_neox")


def make(family: str, **overrides: Any) -> Any:
    """A seeded tiny model of ``family`` (eval mode, float32)."""
    torch.manual_seed(0)
    t = transformers
    common = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
    if family in ("bert", "roberta"):
        cls = t.BertModel if family == "bert" else t.RobertaModel
        config_cls = t.BertConfig if family == "bert" else t.RobertaConfig
        config = config_cls(
            vocab_size=VOCAB, intermediate_size=64, max_position_embeddings=64, **common
        )
    elif family == "gpt2":
        cls, config = (
            t.GPT2LMHeadModel,
            t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        )
    elif family in ("llama", "mistral"):
        cls = t.LlamaForCausalLM if family == "llama" else t.MistralForCausalLM
        config_cls = t.LlamaConfig if family == "llama" else t.MistralConfig
        extra = {} if family == "llama" else {"sliding_window": None}
        config = config_cls(
            vocab_size=VOCAB,
            intermediate_size=64,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **common,
            **extra,
        )
    elif family == "opt":  # scales its queries itself and calls attention with scaling 1.0
        cls, config = (
            t.OPTForCausalLM,
            t.OPTConfig(
                vocab_size=VOCAB,
                ffn_dim=64,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
                **common,
            ),
        )
    elif family == "gpt_neox":  # hands its attention the cache as layer_past=
        cls, config = (
            t.GPTNeoXForCausalLM,
            t.GPTNeoXConfig(
                vocab_size=VOCAB, intermediate_size=64, max_position_embeddings=64, **common
            ),
        )
    elif family == "vit":
        cls, config = (
            t.ViTModel,
            t.ViTConfig(
                image_size=16, patch_size=4, num_channels=3, intermediate_size=64, **common
            ),
        )
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return cls(config).eval()


def make_bart() -> Any:
    """A seeded tiny BART (encoder-decoder: self- and cross-attention), eval mode."""
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return transformers.BartForConditionalGeneration(config).eval()


def inputs(family: str, batch: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    """Seeded inputs of ``family``: token ids, or pixel values for ViT."""
    generator = torch.Generator().manual_seed(1)
    if family == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=generator)}
    return {"input_ids": torch.randint(3, VOCAB, (batch, length), generator=generator)}


def output(model: Any, batch: dict[str, torch.Tensor], **kwargs: Any) -> torch.Tensor:
    """The model's main output tensor (logits or last hidden states)."""
    out = model(**batch, **kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def make_llama4(chunk: int) -> Any:
    """A seeded tiny Llama 4 text model whose layers attend in chunks of ``chunk`` positions
    (chunked attention), eval mode, float64."""
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=1,
        attention_chunk_size=chunk,
        max_position_embeddings=64,
        no_rope_layers=[1, 1],
        use_qk_norm=False,
        interleave_moe_layer_step=0,
        moe_layers=[],
    )
    return transformers.Llama4ForCausalLM(config).eval().double()
