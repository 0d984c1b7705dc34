"""Training runs: typed configs and the papers' presets (the loop and CLI build on them), and
trained runs read back (:func:`load_trained_model`)."""

from .config import (
    PRESETS,
    AttentionConfig,
    DataConfig,
    LoopConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    apply_overrides,
    preset,
)
from .trained import load_trained_model

__all__ = [
    "PRESETS",
    "AttentionConfig",
    "DataConfig",
    "LoopConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "apply_overrides",
    "load_trained_model",
    "preset",
]
