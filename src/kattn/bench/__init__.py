"""Benchmarks and comparisons: timing, memory, approximation error against exact softmax."""

from .experiments import (
    StudyOutput,
    run_kernel,
    run_mechanisms,
    run_norm_sweep,
    run_spectral,
    run_stability,
)
from .kernel_error import KERNEL_VARIANTS, KernelRow, KernelVariant, kernel_study
from .mechanism_error import MechanismRow, mechanism_study
from .report import build_report, collect, write_report
from .speed import Crossover, SpeedConfig, SpeedRow, crossovers, measure_speed
from .speed_report import SpeedRun, benchmark_speed
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
    "SpeedRun",
    "StudyOutput",
    "Timing",
    "benchmark_speed",
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
    "run_kernel",
    "run_mechanisms",
    "run_norm_sweep",
    "run_spectral",
    "run_stability",
    "write_report",
    "write_results",
]
