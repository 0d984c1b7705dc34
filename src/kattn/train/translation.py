"""Task ``translation``: an encoder–decoder (:class:`~kattn.nn.Seq2Seq`) trained on sentence
pairs with label-smoothed cross entropy, scored by loss and, at the end, BLEU with beam search
(Luo et al. 2021, §4.3: IWSLT'14 with a joint BPE of 10K, kernelized attention in encoder,
decoder or both).

An "example" of this objective is a batch of pairs holding at most ``data.max_tokens`` padded
tokens (fairseq's token batching), so ``train.batch_size`` counts such batches per optimiser
step and ``train.eval_batches`` batches per validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import positional
from ..attention.rpe_options import rpe_option_names
from ..data.base import PAD_ID
from ..nn import Seq2Seq
from ..registry import MECHANISMS
from .bleu import Decoding, check_bleu_available, corpus_bleu, translate_ids
from .config import RunConfig
from .field_checks import refuse_image_fields, refuse_unread_data_fields
from .objective_base import SPLITS, Objective, token_metrics, token_rates
from .translation_data import (
    TOKENIZER_FILE,
    TranslationData,
    load_bpe,
    load_translation,
    max_len,
    max_tokens,
)


def attention_plan(config: RunConfig) -> dict[str, Any]:
    """The mechanisms and options of the encoder, decoder and cross-attention (see
    :class:`~kattn.train.config.AttentionConfig`)."""
    a = config.attention
    cross = a.cross or a.name
    if a.cross is None and "rpe" not in a.cross_options and _rpe(cross, a.options) is not None:
        # the encoder's encoding and its options stay with the encoder (source and target
        # positions are not on one axis); an explicit cross_options.rpe is kept
        inherited = {k: v for k, v in a.options.items() if k not in _encoding_keys(a.options)}
        cross_options = {**inherited, "rpe": None, **a.cross_options}
    else:
        cross_options = {**a.options, **a.cross_options}
    return {
        "encoder_attention": a.name,
        "encoder_options": dict(a.options),
        "decoder_attention": a.decoder or a.name,
        "decoder_options": {**a.options, **a.decoder_options},
        "cross_attention": cross,
        "cross_options": cross_options,
    }


def _rpe(name: str, options: dict[str, Any]) -> Any:
    """The relative encoding mechanism ``name`` has with ``options`` (None: none)."""
    entry = MECHANISMS.get(name)
    return {**entry.defaults, **options}.get("rpe")


def _encoding_keys(options: dict[str, Any]) -> set[str]:
    """The options that configure a relative encoding (``rpe`` and the encoding's own)."""
    keys = {"rpe"}
    for name in positional.available():
        keys.update(rpe_option_names(name))
    return keys & set(options)


def build_seq2seq(config: RunConfig, vocab_size: int) -> Seq2Seq:
    """The encoder–decoder of ``config.model`` over a joint vocabulary of ``vocab_size`` ids
    (shared embeddings multiplied by √dim as Vaswani et al. 2017, §3.4; the output layer tied
    to them unless ``model.tie_embeddings`` is False), ``model.num_layers`` encoder and
    decoder blocks."""
    m = config.model
    return Seq2Seq(
        vocab_size, vocab_size, dim=m.dim, num_heads=m.num_heads, ffn_dim=m.ffn_dim,
        num_encoder_layers=m.num_layers, num_decoder_layers=m.num_layers,
        max_len=max_len(config), positions=m.positions, dropout=m.dropout,
        attention_dropout=m.attention_dropout, norm_first=m.norm_first,
        share_embeddings=True, tie_output=m.tie_embeddings, embedding_std=m.embedding_std,
        scale_embeddings=True,
        **attention_plan(config),
    )  # fmt: skip


def _check_sizes(config: RunConfig) -> None:
    data, loop = config.data, config.train
    if data.max_tokens is not None and data.max_tokens < max_len(config):
        raise ValueError(
            f"data.max_tokens ({data.max_tokens}) must be at least data.max_len "
            f"({max_len(config)}): a pair of max_len tokens must fit in a batch"
        )
    if data.bpe_size is not None and data.bpe_size < 260:
        raise ValueError(
            f"data.bpe_size must hold the 4 special tokens and 256 bytes (≥ 260), got "
            f"{data.bpe_size}"
        )
    if loop.bleu_examples is not None and loop.bleu_examples < 1:
        raise ValueError(
            f"train.bleu_examples must be positive (null: every pair), got {loop.bleu_examples}"
        )


def decoding_of(config: RunConfig) -> Decoding:
    loop = config.train
    return Decoding(loop.beam_size, loop.length_penalty, loop.max_len_a, loop.max_len_b)


class Translation(Objective[TranslationData]):
    """Sentence pairs → target tokens; best = lowest validation loss.

    The training loss is cross entropy with ``optim.label_smoothing`` over the non-padded
    target tokens; validation and test report the plain negative log-likelihood (``loss``,
    nats per target token), ``perplexity`` and next-token ``accuracy``. The finished run
    decodes valid and test with beam search and adds their BLEU, and the BLEU of copying the
    source (a floor every model must clear), to ``results.json``.
    """

    task = "translation"
    one_batch_per_micro = True
    best_metric, higher_is_better = "loss", False
    count_key = "tokens"
    shown = ("loss", "accuracy", "tokens_per_s")
    embedded_data = "the embedded corpus (gettext catalogues of this machine)"
    paper_preset = "luo-mt"
    summary_keys = ("task", "mechanism", "decoder_mechanism", "cross_mechanism", "steps",
                    "test_loss", "test_bleu", "valid_bleu", "copy_source_test_bleu",
                    "best_valid_loss", "wall_time_s", "steps_per_s",
                    "tokens_per_s")  # fmt: skip

    @staticmethod
    def check_data_fields(config: RunConfig) -> None:
        refuse_unread_data_fields(config, ("block_size", "truncate"))
        refuse_image_fields(config)
        loop = config.train
        if loop.beam_size < 1 or loop.max_len_b < 0 or loop.max_len_a < 0:
            raise ValueError(
                f"train.beam_size must be positive and train.max_len_a, train.max_len_b ≥ 0, "
                f"got {loop.beam_size}, {loop.max_len_a}, {loop.max_len_b}"
            )
        if config.data.max_tokens is not None and config.data.max_tokens < 8:
            raise ValueError(f"data.max_tokens must be at least 8, got {config.data.max_tokens}")
        plan = attention_plan(config)
        for key in ("encoder_attention", "decoder_attention", "cross_attention"):
            MECHANISMS.get(plan[key])  # an unknown name raises, naming the registered ones
        rpe = _rpe(plan["cross_attention"], plan["cross_options"])
        if rpe is not None:
            raise ValueError(
                f"the cross-attention ({plan['cross_attention']}) has a relative positional "
                f"encoding (rpe={rpe!r}), which step-by-step decoding cannot use (it weights "
                "keys by the target position), and a translation run ends by decoding: set "
                "attention.cross_options.rpe=null or choose attention.cross without one"
            )
        _check_sizes(config)
        check_bleu_available()

    def __init__(self, config: RunConfig, data: TranslationData) -> None:
        super().__init__(config, data)
        self.smoothing = config.optim.label_smoothing
        self.decoding = decoding_of(config)
        self.bleu_examples = config.train.bleu_examples
        self.plan = attention_plan(config)
        budget = max_tokens(config)
        self.unit = f"batches of ≤ {budget:,} tokens"
        self.plans = {split: data.plan(split, budget, config.train.seed) for split in SPLITS}
        train_tokens = sum(len(t) + 1 for t in data.tgt_ids["train"])
        self.tokens_per_batch = train_tokens / max(len(self.plans["train"]), 1)

    @classmethod
    def load_data(cls, config: RunConfig, run_dir: Path | None = None) -> TranslationData:
        return load_translation(config, run_dir)

    @classmethod
    def model_of_run(cls, config: RunConfig, run_dir: Path) -> tuple[nn.Module, Any]:
        """The encoder–decoder, sized by the run folder's vocabulary (no corpus is read
        when the folder has one)."""
        if not (run_dir / TOKENIZER_FILE).is_file():
            data = load_translation(config, run_dir)
            return build_seq2seq(config, data.vocab_size), data.bpe
        bpe = load_bpe(config, None, run_dir)
        return build_seq2seq(config, bpe.vocab_size), bpe

    def build_model(self, config: RunConfig) -> nn.Module:
        return build_seq2seq(config, self.data.vocab_size)

    def write_run_files(self, run_dir: Path) -> None:
        """The vocabulary, so that the run folder alone translates (``kattn translate``)."""
        self.data.bpe.save(run_dir / TOKENIZER_FILE)

    def size(self, split: str) -> int:
        return len(self.plans[split])

    def batch(self, split: str, index: Tensor, device: torch.device) -> dict[str, Tensor]:
        pairs = [i for b in index.tolist() for i in self.plans[split][b]]
        batch = self.data.batch(split, pairs)
        tensors = {
            "src": batch.src, "src_padding": batch.src_padding, "tgt_in": batch.tgt_in,
            "tgt_out": batch.tgt_out, "tgt_padding": batch.tgt_padding,
        }  # fmt: skip
        # a padding mask with no padded token is left out here, on the CPU, so that the
        # forward needs no device-to-host sync to find out
        return {
            name: tensor.to(device, non_blocking=True)
            for name, tensor in tensors.items()
            if not (name.endswith("_padding") and not bool(tensor.any()))
        }

    def forward(self, net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return net(
            batch["src"], batch["tgt_in"], batch.get("src_padding"), batch.get("tgt_padding")
        )

    def loss(self, logits: Tensor, batch: dict[str, Tensor], reduction: str = "mean") -> Tensor:
        """Label-smoothed cross entropy (mean over target tokens) for training; the plain
        negative log-likelihood for the sums of an evaluation (``reduction="sum"``)."""
        smoothing = self.smoothing if reduction == "mean" else 0.0
        return F.cross_entropy(
            logits.float().flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID,
            label_smoothing=smoothing, reduction=reduction,
        )  # fmt: skip

    def counts(self, logits: Tensor, batch: dict[str, Tensor]) -> tuple[int, int]:
        targets = batch["tgt_out"]
        scored = targets != PAD_ID
        correct = (logits.argmax(-1) == targets) & scored
        return int(correct.sum().item()), int(scored.sum().item())

    def metrics(self, sums: list[float], split: str) -> dict[str, float]:
        return token_metrics(sums, "tokens")

    def rates(self, steps: int, seconds: float, batch_size: int) -> dict[str, float]:
        """Steps per second and target tokens per second (the training set's mean target
        tokens per batch times batches per second)."""
        return token_rates(steps, seconds, steps * batch_size * self.tokens_per_batch)

    def bleu(self, model: nn.Module, split: str, device: torch.device) -> dict[str, Any]:
        """BLEU of the beam-searched translations of ``split`` (its first ``bleu_examples``
        pairs), and of copying the source."""
        corpus, data = self.data.corpus, self.data
        count = min(len(data.kept[split]), self.bleu_examples or len(data.kept[split]))
        sources = data.src_ids[split][:count]
        pairs = [corpus.split(split)[i] for i in data.kept[split][:count]]
        decoded = translate_ids(model, sources, self.decoding, device)
        hyps = [data.bpe.decode(ids) for ids in decoded]
        refs = [t for _, t in pairs]
        return {
            "model": corpus_bleu(hyps, refs),
            "copy_source": corpus_bleu([s for s, _ in pairs], refs),
            "samples": [
                {"source": s, "reference": r, "hypothesis": h}
                for (s, r), h in zip(pairs[:5], hyps[:5], strict=True)
            ],
        }

    def final_results(self, model: nn.Module, device: torch.device) -> dict[str, Any]:
        """BLEU on valid and test (beam search with the run's decoding settings)."""
        valid, test = self.bleu(model, "valid", device), self.bleu(model, "test", device)
        return {
            "valid_bleu": valid["model"]["bleu"],
            "test_bleu": test["model"]["bleu"],
            "copy_source_valid_bleu": valid["copy_source"]["bleu"],
            "copy_source_test_bleu": test["copy_source"]["bleu"],
            "bleu": {"valid": valid, "test": test, "decoding": self.decoding.as_dict()},
        }

    def results(self, test: dict[str, float], best: dict[str, float] | None) -> dict[str, Any]:
        results: dict[str, Any] = {f"test_{k}": v for k, v in test.items()}
        for key in ("loss", "perplexity", "accuracy"):
            results[f"best_valid_{key}"] = None if best is None else best[key]
        results["decoder_mechanism"] = self.plan["decoder_attention"]
        results["cross_mechanism"] = self.plan["cross_attention"]
        results["attention_plan"] = self.plan
        results["data"] = self.data.info
        results["tokenizer"] = {"kind": "joint byte-level BPE", "vocab_size": self.data.vocab_size}
        return results

    def summary(self, results: dict[str, Any]) -> str:
        return (
            f"test BLEU {results.get('test_bleu', float('nan')):.2f} (copying the source "
            f"{results.get('copy_source_test_bleu', float('nan')):.2f}), test loss "
            f"{results['test_loss']:.4f} nats per token; best valid loss "
            f"{results['best_valid_loss']} at step {results['best_step']}"
        )
