"""The generated blocks: which table of which page is rendered from which result files."""

from __future__ import annotations

from .entries import Block
from .sources import (
    BASELINE_LISTOPS_RUNS,
    BASELINES,
    DEMO_REPORT,
    FOUNDATION,
    LEARNED,
    LM,
    MECHANISMS,
    NORM_SWEEP,
    NYSTROM,
    PINV_INIT,
    RPE,
    RPE_BLOCKED,
    SEQ2SEQ_DECODE,
    SPARSE,
    SPARSE_LISTOPS_RUNS,
    SPECTRAL,
    SPEED,
    SPEED_RPE,
    STABILITY,
    STUDY_CONVERSION,
    STUDY_FEATURE_DIM,
    STUDY_FEATURE_MAP,
    TRANSLATION_RUNS,
    VISION_CLS_RUNS,
    VISION_GEN_RUNS,
    VIT_SPEED,
)
from .tables import (
    FOUNDATION_PATHS,
    choosing_table,
    demo_summary,
    foundation_memory,
    foundation_ratios,
    learned_table,
    lm_decode,
    lm_train,
    norm_sweep,
    readme_foundation,
    rpe_blocked,
    rpe_decode,
    rpe_paths,
    rpe_sweep,
    times_table,
)
from .tables_baselines import baselines_listops, baselines_speed
from .tables_finetuning import BAG_OF_BYTES, FINETUNING_RUNS, finetuning_runs
from .tables_nystrom import (
    nystrom_speed,
    pinv_approximation,
    pinv_training,
    spectral_table,
    stability_table,
)
from .tables_pretraining import PRETRAINING_RUNS, pretraining_curves, pretraining_runs
from .tables_sparse import sparse_listops, sparse_speed
from .tables_translation import translation_decode
from .tables_translation_runs import study_tables, translation_runs
from .tables_triton import AFTER, BEFORE, shared_memory
from .tables_vision import vision_classification, vision_generation, vit_speed

BLOCKS: list[Block] = [
    Block("README.md", "foundation", (FOUNDATION,), readme_foundation),
    Block("README.md", "demo", (DEMO_REPORT,), demo_summary),
    Block("docs/performance.md", "foundation-times", (FOUNDATION,),
          lambda d: times_table(d, FOUNDATION_PATHS)),
    Block("docs/performance.md", "foundation-ratios", (FOUNDATION,), foundation_ratios),
    Block("docs/performance.md", "foundation-memory", (FOUNDATION,), foundation_memory),
    Block("docs/rpe.md", "rpe-blocked", (RPE_BLOCKED,), rpe_blocked),
    Block("docs/rpe.md", "norm-sweep-prf", (NORM_SWEEP,), norm_sweep("prf")),
    Block("docs/rpe.md", "norm-sweep-trf", (NORM_SWEEP,), norm_sweep("trf")),
    Block("docs/rpe.md", "norm-sweep-nprf", (NORM_SWEEP,), norm_sweep("nprf")),
    Block("docs/rpe.md", "rpe-sweep", (RPE,), rpe_sweep),
    Block("docs/rpe.md", "rpe-paths", (RPE,), rpe_paths),
    Block("docs/rpe.md", "rpe-decode", (RPE,), rpe_decode),
    Block("docs/learned-kernels.md", "learned", (LEARNED,), learned_table),
    Block("docs/language-modelling.md", "lm-decode", (LM,), lm_decode),
    Block("docs/language-modelling.md", "lm-train", (LM,), lm_train),
    Block("docs/choosing-a-mechanism.md", "mechanisms", (SPEED, SPEED_RPE, MECHANISMS),
          choosing_table),
    Block("docs/nystrom.md", "nystrom-speed", (NYSTROM,), nystrom_speed),
    Block("docs/nystrom.md", "spectral", (SPECTRAL,), spectral_table),
    Block("docs/nystrom.md", "stability", (STABILITY,), stability_table),
    Block("docs/nystrom.md", "pinv-init-approximation", (PINV_INIT,), pinv_approximation),
    Block("docs/nystrom.md", "pinv-init-training", (PINV_INIT,), pinv_training),
    Block("docs/sparse.md", "sparse-speed", (SPARSE,), sparse_speed),
    Block("docs/sparse.md", "sparse-listops", SPARSE_LISTOPS_RUNS, sparse_listops),
    Block("docs/baselines.md", "baselines-speed", (BASELINES,), baselines_speed),
    Block("docs/baselines.md", "baselines-listops", BASELINE_LISTOPS_RUNS, baselines_listops),
    Block("docs/translation.md", "translation-decode", (SEQ2SEQ_DECODE,), translation_decode),
    Block("docs/translation.md", "translation-runs", TRANSLATION_RUNS, translation_runs),
    Block("docs/translation.md", "study-conversion", (STUDY_CONVERSION,), study_tables),
    Block("docs/translation.md", "study-feature-dim", (STUDY_FEATURE_DIM,), study_tables),
    Block("docs/translation.md", "study-feature-map", (STUDY_FEATURE_MAP,), study_tables),
    Block("docs/vision.md", "vision-classification", VISION_CLS_RUNS, vision_classification),
    Block("docs/vision.md", "vision-generation", VISION_GEN_RUNS, vision_generation),
    Block("docs/vision.md", "vit-speed", (VIT_SPEED,), vit_speed),
    Block("docs/pretraining.md", "pretraining-runs", PRETRAINING_RUNS, pretraining_runs),
    Block("docs/pretraining.md", "pretraining-curves", PRETRAINING_RUNS, pretraining_curves),
    Block("docs/pretraining.md", "finetuning-runs", (*FINETUNING_RUNS, BAG_OF_BYTES),
          finetuning_runs),
    Block("docs/performance.md", "triton-shared-memory", (BEFORE, AFTER), shared_memory),
]  # fmt: skip
