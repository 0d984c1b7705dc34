"""Benchmarks and comparisons: timing, memory, approximation error against exact softmax."""

from .compare import ComparisonRow, compare_mechanisms, format_table
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
    "ComparisonRow",
    "Rounds",
    "Timing",
    "compare_mechanisms",
    "format_table",
    "interleaved_rounds",
    "machine_info",
    "measure_time",
    "peak_memory_bytes",
    "results_stem",
    "write_results",
]
