"""Training runs: typed configs and the papers' presets (the loop and CLI build on them), a
run's config resolved from a preset and a few settings (:func:`resolve_config`), trained runs
read back (:func:`load_trained_model`), evaluated again (:func:`evaluate_saved_run`) and, for
language models, sampled (:func:`generate_text`)."""

from .config import (
    AttentionConfig,
    DataConfig,
    LoopConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
)
from .generate import Generation, generate_text
from .overrides import PRESETS, apply_overrides, preset
from .run import TrainOptions, evaluate_saved_run, resolve_config
from .trained import load_trained_model

__all__ = [
    "PRESETS",
    "AttentionConfig",
    "DataConfig",
    "Generation",
    "LoopConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainOptions",
    "apply_overrides",
    "evaluate_saved_run",
    "generate_text",
    "load_trained_model",
    "preset",
    "resolve_config",
]
