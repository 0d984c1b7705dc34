"""Benchmarks and comparisons: timing, memory, approximation error against exact softmax."""

from .kernel_error import KERNEL_VARIANTS, KernelRow, KernelVariant, kernel_study
from .mechanism_error import MechanismRow, mechanism_study
from .report import build_report, collect
from .speed import Crossover, SpeedConfig, SpeedRow, crossovers, measure_speed
from .timing import (
    Rounds,
    Timing,
    interleaved_rounds,
    machine_info,
    measure_time,
    peak_memory_bytes,
    results_stem,
    write_results,
)

__all__ = [
    "KERNEL_VARIANTS",
    "Crossover",
    "KernelRow",
    "KernelVariant",
    "MechanismRow",
    "Rounds",
    "SpeedConfig",
    "SpeedRow",
    "Timing",
    "build_report",
    "collect",
    "crossovers",
    "interleaved_rounds",
    "kernel_study",
    "machine_info",
    "measure_speed",
    "measure_time",
    "mechanism_study",
    "peak_memory_bytes",
    "results_stem",
    "write_results",
]
