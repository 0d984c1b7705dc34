"""Benchmarks and comparisons: timing, memory, approximation error against exact softmax."""

from .compare import ComparisonRow, compare_mechanisms, format_table
from .kernel_error import KERNEL_VARIANTS, KernelRow, KernelVariant, kernel_study
from .mechanism_error import EXACT_COUNTERPARTS, MechanismRow, mechanism_study
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
    "EXACT_COUNTERPARTS",
    "KERNEL_VARIANTS",
    "ComparisonRow",
    "KernelRow",
    "KernelVariant",
    "MechanismRow",
    "Rounds",
    "Timing",
    "compare_mechanisms",
    "format_table",
    "interleaved_rounds",
    "kernel_study",
    "machine_info",
    "measure_time",
    "mechanism_study",
    "peak_memory_bytes",
    "results_stem",
    "write_results",
]
