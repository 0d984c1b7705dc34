"""The papers' settings per task: preset name → task → dotted config key → value.

:func:`kattn.train.preset` turns one into a :class:`~kattn.train.RunConfig`; the dataclass
defaults of :mod:`kattn.train.config` are Skyformer's, so a preset lists what differs.
"""

from __future__ import annotations

import math
from typing import Any

from .config import CLASSIFICATION_TASKS

#: the optimiser and model conventions shared by the official LRA configs and the KL-Transformer:
#: AdamW β₂ 0.98, eps 1e-9, weight decay 0.1, linear warm-up then rsqrt decay, no clipping,
#: N(0, 1) embeddings, CLS head of the MLP width.
_LRA: dict[str, Any] = {
    "optim.beta2": 0.98, "optim.eps": 1e-9, "optim.weight_decay": 0.1, "optim.schedule": "rsqrt",
    "optim.grad_clip_value": None, "model.embedding_std": 1.0,
}  # fmt: skip


def _model(dim: int, layers: int, heads: int, mlp: int, pooling: str, positions: str) -> dict:
    return {
        "model.dim": dim, "model.num_layers": layers, "model.num_heads": heads,
        "model.ffn_dim": mlp, "model.head_hidden": mlp, "model.pooling": pooling,
        "model.positions": positions,
    }  # fmt: skip


#: per-task settings of the papers: name → task → dotted key → value.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # Skyformer / Nyströmformer LRA code (implementation notes §A.6): 2 layers, dim 64, 2 heads,
    # FFN 128, mean pooling, pre-LN, dropout 0.1, AdamW eps 1e-6, one-cycle, value clipping 1,
    # 50k steps, best checkpoint after 20 % of them; ListOps/Text cut to 2000/4000, padded to
    # a power of two.
    "skyformer": {
        "listops": {"train.batch_size": 32, "optim.lr": 1e-4, "optim.warmup_steps": 1000,
                    "train.eval_every": 500, "train.eval_batches": 62, "data.max_len": 2048,
                    "data.truncate": 2000, "data.tokenization": "legacy"},
        "text": {"train.batch_size": 32, "optim.lr": 1e-4, "optim.warmup_steps": 80,
                 "train.eval_every": 500, "train.eval_batches": 200, "data.max_len": 4096,
                 "data.truncate": 4000},
        "retrieval": {"train.batch_size": 16, "optim.lr": 2e-4, "optim.warmup_steps": 800,
                      "train.eval_every": 1000, "train.eval_batches": 300, "data.max_len": 4096,
                      "data.truncate": 4000},
        "image": {"train.batch_size": 256, "optim.lr": 1e-4, "optim.warmup_steps": 175,
                  "train.eval_every": 50, "train.eval_batches": 20, "data.max_len": 1024},
        "pathfinder": {"train.batch_size": 128, "optim.lr": 2e-4, "optim.warmup_steps": 312,
                       "train.eval_every": 500, "train.eval_batches": 156,
                       "data.max_len": 1024},
    },
    # The official LRA configs (JAX, implementation notes §D.5).
    "lra": {
        "listops": {**_LRA, **_model(512, 4, 8, 1024, "cls", "sinusoidal"),
                    "optim.lr": 0.05, "optim.warmup_steps": 1000, "train.steps": 5000,
                    "train.eval_every": 50, "train.batch_size": 32, "data.max_len": 2000},
        "text": {**_LRA, **_model(256, 4, 4, 1024, "cls", "sinusoidal"),
                 "optim.lr": 0.05, "optim.warmup_steps": 8000, "train.steps": 20000,
                 "train.eval_every": 500, "train.batch_size": 32, "data.max_len": 1000},
        "retrieval": {**_LRA, **_model(128, 4, 4, 512, "cls", "sinusoidal"),
                      "optim.lr": 0.05, "optim.warmup_steps": 8000, "train.steps": 5000,
                      "train.eval_every": 500, "train.batch_size": 32, "data.max_len": 4000},
        "image": {**_LRA, **_model(128, 1, 8, 128, "cls", "learned"),
                  "model.dropout": 0.3, "model.attention_dropout": 0.2,
                  "optim.lr": 5e-4, "optim.warmup_steps": 175, "optim.schedule": "cosine",
                  "optim.weight_decay": 0.0, "train.steps": 35000, "train.eval_every": 175,
                  "train.batch_size": 256, "data.max_len": 1024},
        "pathfinder": {**_LRA, **_model(32, 4, 4, 32, "mean", "sinusoidal"),
                       "model.dropout": 0.2, "optim.lr": 1e-3, "optim.warmup_steps": 312,
                       "optim.schedule": "cosine", "optim.weight_decay": 0.0,
                       "train.steps": 62400, "train.eval_every": 312,
                       "train.batch_size": 512, "data.max_len": 1024},
    },
    # The KL-Transformer ("On Learning the Transformer Kernel", Table 4; no Pathfinder there).
    "kl": {
        "listops": {**_LRA, **_model(512, 6, 8, 2048, "cls", "sinusoidal"),
                    "optim.lr": 5e-3, "optim.warmup_steps": 1000, "train.steps": 10000,
                    "train.eval_every": 500, "train.batch_size": 32, "data.max_len": 2000},
        "text": {**_LRA, **_model(256, 4, 4, 1024, "cls", "sinusoidal"),
                 "optim.lr": 0.05, "optim.warmup_steps": 8000, "train.steps": 20000,
                 "train.eval_every": 500, "train.batch_size": 32, "data.max_len": 4000},
        "retrieval": {**_LRA, **_model(128, 4, 4, 512, "cls", "sinusoidal"),
                      "optim.lr": 0.05, "optim.warmup_steps": 8000, "train.steps": 5000,
                      "train.eval_every": 500, "train.batch_size": 32, "data.max_len": 4000},
        "image": {**_LRA, **_model(128, 1, 8, 128, "cls", "learned"),
                  "model.dropout": 0.3, "optim.lr": 5e-4, "optim.warmup_steps": 175,
                  "optim.schedule": "cosine", "optim.weight_decay": 0.0, "train.steps": 35200,
                  "train.eval_every": 176, "train.batch_size": 256, "data.max_len": 1024},
    },
    # Minutes on a CPU: the Skyformer model without dropout, a larger learning rate and few
    # steps (the embedded default of `kattn train --task listops`: short generated expressions);
    # for lm a 2-layer byte-level decoder on the embedded standard-library corpus.
    "small": {
        **{task: {"optim.lr": 1e-3, "optim.warmup_steps": 100, "train.steps": 3000,
                  "train.eval_every": 500, "train.batch_size": 64, "model.dropout": 0.0,
                  "model.attention_dropout": 0.0}
           for task in CLASSIFICATION_TASKS},
        "lm": {"model.dim": 128, "model.num_layers": 2, "model.num_heads": 4,
               "model.ffn_dim": 512, "model.dropout": 0.0, "model.attention_dropout": 0.0,
               "data.block_size": 256, "train.batch_size": 16, "train.steps": 1000,
               "train.eval_every": 200, "train.eval_batches": 8, "optim.lr": 2e-3,
               "optim.schedule": "cosine", "optim.warmup_steps": 100, "optim.beta2": 0.99,
               "optim.weight_decay": 0.01, "optim.grad_clip_value": None,
               "optim.grad_clip_norm": 1.0},
    },
    # Luo et al. 2021's WikiText-103 decoder (§4.2, appendix A.2): 6 layers, 8 heads, dim 512,
    # FFN 2048, M = 64 random features, blocks of 512, batch 64, dropout 0.1, weight decay
    # 0.01, Adam (0.9, 0.98) eps 1e-6, 150k steps, 6k warm-up then inverse square root with a
    # peak of 2e-3 (kattn's rsqrt peaks at lr/√w, hence lr = 2e-3·√6000).
    "luo-lm": {
        "lm": {"model.dim": 512, "model.num_layers": 6, "model.num_heads": 8,
               "model.ffn_dim": 2048, "model.dropout": 0.1, "model.attention_dropout": 0.0,
               "model.positions": "sinusoidal", "attention.name": "performer",
               "attention.options.num_features": 64, "data.block_size": 512,
               "train.batch_size": 64, "train.steps": 150000, "train.eval_every": 2000,
               "optim.lr": 2e-3 * math.sqrt(6000), "optim.warmup_steps": 6000,
               "optim.schedule": "rsqrt", "optim.beta2": 0.98, "optim.eps": 1e-6,
               "optim.weight_decay": 0.01, "optim.grad_clip_value": None},
    },
    # Luo et al. 2021's IWSLT'14 encoder–decoder (§4.3): 6 + 6 layers, dim 512, 4 heads, FFN
    # 1024, NPRF with RPE everywhere, M = 16 random features in the encoder and 24 in the
    # decoder (its self- and cross-attention), a joint BPE of 10K. Appendix A.3 gives the rest:
    # label smoothing 0.1, dropout 0.3, batches of 8,192 tokens, Adam (0.9, 0.98), 50k steps
    # with peak 5e-4 after 4,000 warm-up steps then inverse square root (kattn's rsqrt peaks at
    # lr/√w, hence lr = 5e-4·√4000), beam 5 with length penalty 1.2. Weight decay 1e-4 is
    # fairseq's IWSLT recipe (the paper gives none).
    "luo-mt": {
        "translation": {"model.dim": 512, "model.num_layers": 6, "model.num_heads": 4,
                        "model.ffn_dim": 1024, "model.dropout": 0.3,
                        "model.attention_dropout": 0.0, "model.positions": "sinusoidal",
                        "model.embedding_std": 512**-0.5, "attention.name": "nprf_rpe",
                        "attention.options.num_features": 16,
                        "attention.decoder_options.num_features": 24,
                        "attention.cross_options.num_features": 24,
                        "data.max_tokens": 8192, "data.bpe_size": 10000,
                        "train.batch_size": 1, "train.steps": 50000, "train.eval_every": 1000,
                        "train.beam_size": 5, "train.length_penalty": 1.2,
                        "optim.lr": 5e-4 * math.sqrt(4000), "optim.warmup_steps": 4000,
                        "optim.schedule": "rsqrt", "optim.beta2": 0.98, "optim.eps": 1e-8,
                        "optim.weight_decay": 1e-4, "optim.label_smoothing": 0.1,
                        "optim.grad_clip_value": None},
    },
}  # fmt: skip

# Minutes on a CPU: a 2 + 2-layer encoder–decoder of width 128 on the embedded corpus with a
# joint BPE of 4K, greedy-friendly beam 4.
PRESETS["small"]["translation"] = {
    "model.dim": 128, "model.num_layers": 2, "model.num_heads": 4, "model.ffn_dim": 256,
    "model.dropout": 0.1, "model.attention_dropout": 0.0, "model.positions": "sinusoidal",
    "model.embedding_std": 128**-0.5, "data.max_tokens": 2048, "data.bpe_size": 4000,
    "train.batch_size": 1,
    "train.steps": 1500, "train.eval_every": 250, "train.beam_size": 4,
    "train.length_penalty": 1.0, "optim.lr": 2e-3, "optim.schedule": "cosine",
    "optim.warmup_steps": 100, "optim.beta2": 0.98, "optim.weight_decay": 1e-4,
    "optim.label_smoothing": 0.1, "optim.grad_clip_value": None, "optim.grad_clip_norm": 1.0,
}  # fmt: skip

# Minutes on a CPU, on the embedded 32×32 shapes: a 4-layer ViT of width 64 on 4×4 patches (64
# tokens) with DeiT's recipe scaled down (AdamW, cosine with warm-up, label smoothing 0.1,
# random resized crops and flips, stochastic depth 0.1).
PRESETS["small"]["image-classification"] = {
    "model.dim": 64, "model.num_layers": 4, "model.num_heads": 4, "model.ffn_dim": 128,
    "model.patch_size": 4, "model.drop_path": 0.1, "model.pooling": "mean",
    "model.positions": "learned", "model.dropout": 0.0, "model.attention_dropout": 0.0,
    "attention.options.num_features": 32, "data.crop_scale": 0.35,
    "train.batch_size": 64, "train.steps": 1500, "train.eval_every": 250,
    "optim.lr": 2e-3, "optim.schedule": "cosine", "optim.warmup_steps": 100,
    "optim.weight_decay": 0.05, "optim.eps": 1e-8, "optim.label_smoothing": 0.1,
    "optim.grad_clip_value": None, "optim.grad_clip_norm": 1.0,
}  # fmt: skip

# Minutes on a CPU: the embedded shapes at 16×16 (768 sub-pixels), a 3-layer decoder of width
# 64 with the optimiser of Luo et al. 2021, Appendix A.5.
PRESETS["small"]["image-generation"] = {
    "model.dim": 64, "model.num_layers": 3, "model.num_heads": 4, "model.ffn_dim": 128,
    "model.positions": "none", "model.dropout": 0.0, "model.attention_dropout": 0.0,
    "attention.options.num_features": 32, "data.image_size": 16,
    "train.batch_size": 16, "train.steps": 500, "train.eval_every": 100,
    "train.eval_batches": 8, "optim.lr": 2e-3, "optim.schedule": "cosine",
    "optim.warmup_steps": 50, "optim.beta2": 0.98, "optim.eps": 1e-6,
    "optim.weight_decay": 0.01, "optim.grad_clip_value": None, "optim.grad_clip_norm": 1.0,
}  # fmt: skip

# Luo et al. 2021, §4.4 and Appendix A.4 (ImageNet-1K at 224×224, following DeiT, Touvron et
# al. 2021): DeiT-base (12 layers, 768, 12 heads, FFN 3072, 16×16 patches), M = 32 random
# features, 2-D relative positions, global average pooling + a linear head, AdamW (0.9, 0.999)
# eps 1e-8, weight decay 0.05, batch 1024, label smoothing 0.1, 450 epochs of cosine decay
# after 20 of linear warm-up (1,251 steps per epoch), DeiT's augmentation (RandAugment 9/0.5,
# mixup 0.8, cutmix 1.0) and stochastic depth 0.1. The peak learning rate is DeiT's
# 5e-4·batch/512 = 1e-3; the paper's "initial learning rate of 1e-5" matches no step of
# DeiT's schedule (its warm-up starts at 1e-6 and its cosine ends at 1e-5), and kattn's cosine
# warms up from 0 and decays to 0. Distillation, repeated augmentation and random erasing are
# not used here (the paper drops distillation).
PRESETS["luo-deit"] = {
    "image-classification": {
        "model.dim": 768, "model.num_layers": 12, "model.num_heads": 12, "model.ffn_dim": 3072,
        "model.patch_size": 16, "model.drop_path": 0.1, "model.pooling": "mean",
        "model.positions": "learned", "model.dropout": 0.0, "model.attention_dropout": 0.0,
        "attention.name": "nprf_rpe", "attention.options.num_features": 32,
        "data.image_size": 224, "data.crop_scale": 0.08, "data.randaugment": "2,9",
        "data.mixup": 0.8, "data.cutmix": 1.0,
        "train.batch_size": 1024, "train.steps": 450 * 1251, "train.eval_every": 5 * 1251,
        "optim.lr": 1e-3, "optim.schedule": "cosine", "optim.warmup_steps": 20 * 1251,
        "optim.beta2": 0.999, "optim.eps": 1e-8, "optim.weight_decay": 0.05,
        "optim.label_smoothing": 0.1, "optim.grad_clip_value": None,
    },
}  # fmt: skip

# Luo et al. 2021, Appendix A.5 (ImageNet32 generation, 3,072 sub-pixels): 6 layers, 512, 8
# heads, NPRF with 2-D RPE, M = 32, batch 64, Adam (0.9, 0.98) eps 1e-6, dropout 0.1, weight
# decay 0.01, peak learning rate 5e-4. The paper gives no FFN width, schedule or step count:
# FFN 2048 (4×), 4,000 warm-up steps then inverse square root (kattn's rsqrt peaks at lr/√w),
# 200k steps are ours.
PRESETS["luo-imagenet32"] = {
    "image-generation": {
        "model.dim": 512, "model.num_layers": 6, "model.num_heads": 8, "model.ffn_dim": 2048,
        "model.positions": "none", "model.dropout": 0.1, "model.attention_dropout": 0.0,
        "attention.name": "nprf_rpe", "attention.options.num_features": 32,
        "data.image_size": 32, "train.batch_size": 64, "train.steps": 200000,
        "train.eval_every": 2000, "train.eval_batches": 50,
        "optim.lr": 5e-4 * math.sqrt(4000), "optim.warmup_steps": 4000, "optim.schedule": "rsqrt",
        "optim.beta2": 0.98, "optim.eps": 1e-6, "optim.weight_decay": 0.01,
        "optim.grad_clip_value": None,
    },
}  # fmt: skip

# Minutes on a CPU (task mlm, the embedded corpus): a 2-layer pre-LN encoder of width 128 over
# byte sequences of 128 ([CLS] and [SEP] included), BERT's masking, linear warm-up and decay.
PRESETS["small"]["mlm"] = {
    "model.dim": 128, "model.num_layers": 2, "model.num_heads": 4, "model.ffn_dim": 512,
    "model.dropout": 0.0, "model.attention_dropout": 0.0, "data.max_len": 128,
    "train.batch_size": 32, "train.steps": 1500, "train.eval_every": 250,
    "train.eval_batches": 16, "optim.lr": 1e-3, "optim.schedule": "linear",
    "optim.warmup_steps": 100, "optim.eps": 1e-6, "optim.weight_decay": 0.01,
    "optim.grad_clip_value": None, "optim.grad_clip_norm": 1.0,
}  # fmt: skip

# Luo et al. 2021, §4.1 and Appendix A.1 (Table 5): BERT-base (12 layers, 768, 12 heads, FFN
# 3072, post-LN, learned positions as RoBERTa) with NPRF and RPE, masked language modelling
# with 0.15 of the tokens masked (80/10/10), sequences of 512, batch 2048, 1000k steps, Adam
# (0.9, 0.999) eps 1e-6, peak 2e-4 after 20k warm-up steps then linear decay to 0, dropout
# 0.1, gradient norm clipped to 1.0, weight decay 0.01. The paper gives no number of random
# features for pre-training: M = 64, that of its WikiText-103 model (§4.2), the head width.
# The batch of 2048 is 32 accumulated micro-batches (64 sequences each on one device). The
# dropout is the blocks': kernelized attention has no weight matrix to drop out.
PRESETS["luo-bert-base"] = {
    "mlm": {
        "model.dim": 768, "model.num_layers": 12, "model.num_heads": 12, "model.ffn_dim": 3072,
        "model.norm_first": False, "model.embedding_norm": True, "model.positions": "learned",
        "model.dropout": 0.1,
        "model.attention_dropout": 0.0, "attention.name": "nprf_rpe",
        "attention.options.num_features": 64, "data.max_len": 512,
        "train.batch_size": 2048, "optim.accumulate": 32, "train.steps": 1_000_000,
        "train.eval_every": 10_000, "train.eval_batches": 4, "optim.lr": 2e-4,
        "optim.schedule": "linear", "optim.warmup_steps": 20_000, "optim.beta2": 0.999,
        "optim.eps": 1e-6, "optim.weight_decay": 0.01, "optim.grad_clip_value": None,
        "optim.grad_clip_norm": 1.0,
    },
}  # fmt: skip

# The KL-Transformer's GLUE pre-training (Chowdhury et al., Appendix B.3, Table 6): 3 layers,
# embedding 300, 10 heads, FFN 512, sinusoidal positions, dropout 0.1, sequences of 512,
# batch 64, Adam with weight decay 0.01 and (0.9, 0.999), peak 5e-4 after 10k warm-up steps
# then linear decay to 0 (their min(i/10⁴, (I − i)/(I − 10⁴))), GMM-PRF with M = 128 (of
# their {64, 128}). Five epochs of WikiText-103 at one token per word: 5 · ⌈103,227,021 /
# (64 · 510)⌉ = 15,815 steps. Not given there: Adam's eps (PyTorch's 1e-8), clipping (none).
# Their heads are 64 wide (Key/Query/Value Dimension); kattn's heads split the width, 30 each.
PRESETS["kl-glue"] = {
    "mlm": {
        "model.dim": 300, "model.num_layers": 3, "model.num_heads": 10, "model.ffn_dim": 512,
        "model.positions": "sinusoidal", "model.dropout": 0.1, "model.attention_dropout": 0.0,
        "attention.name": "gmm_prf", "attention.options.num_features": 128,
        "data.max_len": 512, "train.batch_size": 64, "train.steps": 15_815,
        "train.eval_every": 1000, "optim.lr": 5e-4, "optim.schedule": "linear",
        "optim.warmup_steps": 10_000, "optim.beta2": 0.999, "optim.eps": 1e-8,
        "optim.weight_decay": 0.01, "optim.grad_clip_value": None,
    },
}  # fmt: skip

# Minutes on a CPU (tasks text-classification and finetune, the embedded gettext set): the
# encoder of the small mlm preset (2 layers, width 128, sequences of 128) with RoBERTa's head
# on [CLS] and dropout 0.1, 1,000 steps of 32 (about five epochs of the embedded set), linear
# warm-up and decay. From scratch at the small mlm preset's rate; fine-tuned at half of it
# (as BERT fine-tunes at up to 5e-5 after pre-training at 1e-4) with Adam's β₂ 0.98 (Luo et
# al. 2021, Table 5). Fine-tuning takes the encoder's fields from the pre-trained run
# (kattn.train.finetune.ENCODER_FIELDS), so its presets set none of them.
_TEXT_SMALL: dict[str, Any] = {
    "model.dropout": 0.1, "model.attention_dropout": 0.0, "model.pooling": "cls",
    "train.batch_size": 32, "train.steps": 1000, "train.eval_every": 200,
    "optim.schedule": "linear", "optim.warmup_steps": 60, "optim.eps": 1e-6,
    "optim.weight_decay": 0.01, "optim.grad_clip_value": None, "optim.grad_clip_norm": 1.0,
}  # fmt: skip
PRESETS["small"]["text-classification"] = {
    **_TEXT_SMALL, "model.dim": 128, "model.num_layers": 2, "model.num_heads": 4,
    "model.ffn_dim": 512, "data.max_len": 128, "optim.lr": 1e-3,
}  # fmt: skip
PRESETS["small"]["finetune"] = {**_TEXT_SMALL, "optim.lr": 5e-4, "optim.beta2": 0.98}

# Luo et al. 2021, Appendix A.1, Table 5 (fine-tuning column): Adam (0.9, 0.98) eps 1e-6,
# linear decay after a warm-up of 6 % of the steps, batch 32 (of their 16 or 32), dropout 0.1,
# weight decay 0.01, gradient norm clipped to 1.0, sequences of 512 (the pre-trained run's),
# 10 epochs (5 for MNLI, QQP and QNLI); the dropout is the blocks' (as in pre-training:
# kernelized attention has no weight matrix to drop out). The learning rate is 2e-5, the
# middle of their grid {5e-6, 1e-5, 2e-5, 3e-5, 4e-5} (they report the best of the grid,
# each the median of five seeds). The steps are 10 epochs of RTE (2,241 examples once a tenth
# is held out: 71 batches); for another task set --steps to epochs · ⌈examples / 32⌉ and
# optim.warmup_steps to 6 % of it.
PRESETS["luo-bert-base"]["finetune"] = {
    "model.dropout": 0.1, "model.attention_dropout": 0.0, "model.pooling": "cls",
    "train.batch_size": 32, "train.steps": 710, "train.eval_every": 71, "optim.lr": 2e-5,
    "optim.schedule": "linear", "optim.warmup_steps": 43, "optim.beta2": 0.98,
    "optim.eps": 1e-6, "optim.weight_decay": 0.01, "optim.grad_clip_value": None,
    "optim.grad_clip_norm": 1.0,
}  # fmt: skip

# The KL-Transformer's GLUE fine-tuning (Chowdhury et al., Appendix B.3, Table 6): batch 64,
# 10 epochs, AdamW (0.9, 0.999) with weight decay 0.01, dropout 0.1, the rate rising linearly
# over the first tenth of the steps and decaying linearly to 0 (their min(10i/I, (I − i)/(0.9 I))),
# a classifier of width 128 with tanh on the CLS output. The rate is 1e-4 of their grid {2e-3,
# 1e-4, 5e-4, 2e-5, 5e-6}; eps (PyTorch's 1e-8) and clipping (none) are not given there. The
# steps are 10 epochs of RTE (2,241 examples once a tenth is held out: 36 batches of 64).
PRESETS["kl-glue"]["finetune"] = {
    "model.dropout": 0.1, "model.attention_dropout": 0.0, "model.pooling": "cls",
    "model.head_hidden": 128, "train.batch_size": 64, "train.steps": 360,
    "train.eval_every": 36, "optim.lr": 1e-4, "optim.schedule": "linear",
    "optim.warmup_steps": 36, "optim.beta2": 0.999, "optim.eps": 1e-8,
    "optim.weight_decay": 0.01, "optim.grad_clip_value": None,
}  # fmt: skip
