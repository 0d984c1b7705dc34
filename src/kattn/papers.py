"""The comparison tables of the papers kattn implements: every system they report, and the
registered mechanism (with options) that runs it, or why none is an attention mechanism.

The papers: Luo et al., "Stable, Fast and Accurate: Kernelized Attention with Relative
Positional Encoding", NeurIPS 2021; Chen et al., "Skyformer: Remodel Self-Attention with
Gaussian Kernel and Nyström Method", NeurIPS 2021; "On Learning the Transformer Kernel" (the
KL-Transformer paper); Yorsh, "The Study of Linear Self-Attention Mechanism in Transformer",
bachelor's thesis, CTU Prague 2022. ``tests/test_paper_tables.py`` fails when a row names no
registered mechanism, so that any table of the papers can be rerun with kattn alone.

ListOps accuracies are the papers' own reported numbers (Long Range Arena ListOps, length 2K),
kept to put beside kattn's runs; they are not kattn measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Row:
    """A row of a paper's table: its label as printed, the kattn mechanism and options that
    run it (None: not an attention mechanism, ``why`` says what it is), and the ListOps
    accuracy (%) the paper reports for it, if any."""

    label: str
    mechanism: str | None
    options: dict[str, Any] = field(default_factory=dict)
    listops: float | None = None
    why: str = ""


@dataclass(frozen=True)
class PaperTable:
    paper: str
    table: str
    caption: str
    rows: tuple[Row, ...]


_NPRF_NO_RPE = {"feature_map": "prf", "normalize_qk": True}

LUO = "Luo et al. 2021"
SKYFORMER = "Chen et al. 2021 (Skyformer)"
KL = "On Learning the Transformer Kernel (KL-Transformer)"
THESIS = "Yorsh 2022 (thesis)"


def _lra_baselines(listops: dict[str, float]) -> tuple[Row, ...]:
    """The Long Range Arena baselines as the KL-Transformer paper (Table 2) and the thesis
    (Table 4.1) print them, with their ListOps numbers."""
    names = {
        "Softmax Trans.": "softmax",
        "Synthesizer": "synthesizer",
        "Sinkhorn": "sinkhorn",
        "Sparse Trans.": "sparse_transformer",
        "Reformer": "reformer",
        "Local Attention": "local",
        "Longformer": "longformer",
        "Linformer": "linformer",
        "Big Bird": "bigbird",
        "LinearElu": "linear",
        "Performer": "performer",
        "GMM-RKS": "gmm_rks",
        "FastFood-RKS": "fastfood_rks",
        "Generative-RKS": "generative_rks",
        "GMM-PRF": "gmm_prf",
        "FastFood-PRF": "fastfood_prf",
        "Generative-PRF": "generative_prf",
    }
    return tuple(Row(label, names[label], listops=value) for label, value in listops.items())


RANDOM = Row("Random predictor", None, listops=10.0, why="a constant-prediction reference")

TABLES: tuple[PaperTable, ...] = (
    PaperTable(LUO, "Table 1", "GLUE dev set", (
        Row("SMYRF", "smyrf"),
        Row("FCA (fast clustered attention)", "clustered"),
        Row("Improved FCA", "improved_clustered"),
        Row("Linformer", "linformer"),
        Row("Nyströmformer", "nystromformer"),
        Row("NPRF-Transformer with RPE (ours)", "nprf_rpe"),
    )),
    PaperTable(LUO, "Table 2", "WikiText-103 perplexity", (
        Row("Vanilla Transformer", "softmax"),
        Row("Linear Transformer", "linear"),
        Row("TRF-Transformer (RFA)", "rfa"),
        Row("TRF-Transformer-GATE (RFA-Gate)", "rfa_gate"),
        Row("NPRF-Transformer with RPE (ours)", "nprf_rpe"),
    )),
    PaperTable(LUO, "Table 3", "IWSLT14 BLEU", (
        Row("Standard enc-dec", "softmax"),
        Row("Standard enc + PRF dec", "performer"),
        Row("PRF enc-dec", "performer"),
        Row("NPRF enc-dec with RPE (ours)", "nprf_rpe"),
    )),
    PaperTable(LUO, "Table 4", "ImageNet-1K", (
        Row("ViT-base", "softmax"),
        Row("ViT-large", "softmax"),
        Row("DeiT-base", "softmax"),
        Row("PRF DeiT-base (fine-tuned)", "performer"),
        Row("NPRF DeiT-base without RPE", "kernelized", _NPRF_NO_RPE),
        Row("NPRF DeiT-base with RPE (ours)", "nprf_rpe"),
    )),
    PaperTable(LUO, "Table 6 (appendix)", "ImageNet32 generation, bits/dim", (
        Row("ScoreFlow", None, why="a score-based flow model, no attention layer compared"),
        Row("VDM", None, why="a variational diffusion model, no attention layer compared"),
        Row("DenseFlow", None, why="a normalising flow, no attention layer compared"),
        Row("Image Transformer", "local"),
        Row("PRF-Transformer", "performer"),
        Row("NPRF-Transformer with RPE (ours)", "nprf_rpe"),
    )),
    PaperTable(SKYFORMER, "Table 1", "Long Range Arena accuracy", (
        Row("Self-Attention", "softmax", listops=38.37),
        Row("Kernelized Attention", "gaussian", listops=38.78),
        Row("Nystromformer", "nystromformer", listops=38.51),
        Row("Linformer", "linformer", listops=37.45),
        Row("Informer", "informer", listops=32.53),
        Row("Performer", "performer", listops=38.02),
        Row("Reformer", "reformer", listops=37.68),
        Row("BigBird", "bigbird", listops=39.25),
        Row("Skyformer", "skyformer", listops=38.69),
    )),
    PaperTable(KL, "Table 2", "Long Range Arena accuracy (baselines as in Tay et al. 2021)", (
        RANDOM,
        *_lra_baselines({
            "Softmax Trans.": 36.38, "Synthesizer": 36.50, "Sinkhorn": 34.20,
            "Sparse Trans.": 35.78, "Reformer": 36.30, "Local Attention": 15.95,
            "Longformer": 36.03, "Linformer": 35.49, "Big Bird": 37.08, "LinearElu": 17.15,
            "Performer": 36.00, "GMM-RKS": 18.15, "FastFood-RKS": 18.2,
            "Generative-RKS": 17.80, "GMM-PRF": 36.95, "FastFood-PRF": 37.25,
            "Generative-PRF": 37.10,
        }),
    )),
    PaperTable(THESIS, "Table 4.1", "three LRA tasks (baselines from Tay et al. 2021)", (
        RANDOM,
        *_lra_baselines({
            "Softmax Trans.": 36.37, "Synthesizer": 36.99, "Sinkhorn": 33.67,
            "Sparse Trans.": 17.07, "Reformer": 37.27, "Local Attention": 15.82,
            "Longformer": 35.63, "Linformer": 35.70, "Big Bird": 36.05, "LinearElu": 16.13,
            "Performer": 18.01, "GMM-RKS": 18.15, "FastFood-RKS": 18.20,
            "Generative-RKS": 17.80, "GMM-PRF": 36.95, "FastFood-PRF": 37.25,
            "Generative-PRF": 37.10,
        }),
        Row("Linear kernel", "ffk_linear", listops=18.54),
        Row("n× GLU", "ffk_glu", listops=18.67),
        Row("Orth. linear kernel", "ffk_linear", listops=18.19),
        Row("n× OGLU", "ffk_oglu", listops=18.45),
        Row("3× AOGLU", "ffk_aoglu", listops=18.45),
        Row("Variational", "ffk_vae"),
        Row("Simple (SimpleTRON)", "simpletron", listops=37.45),
    )),
    PaperTable(THESIS, "Table 4.2", "AG News fine-tuning", (
        Row("BERT", "softmax"),
        Row("FFK Lin.", "ffk_linear"),
        Row("FFK 2× GLU", "ffk_glu"),
        Row("Simple (SimpleTRON)", "simpletron"),
    )),
)  # fmt: skip


def table_mechanisms() -> list[str]:
    """Every mechanism the tables name, sorted."""
    return sorted({r.mechanism for t in TABLES for r in t.rows if r.mechanism is not None})


def reported_listops(mechanism: str) -> list[tuple[str, float]]:
    """``(paper and table, ListOps %)`` for every table that reports ``mechanism`` on ListOps
    (the papers' numbers, Long Range Arena at length 2K)."""
    return [
        (f"{t.paper}, {t.table}", r.listops)
        for t in TABLES
        for r in t.rows
        if r.mechanism == mechanism and r.listops is not None and not r.options
    ]
