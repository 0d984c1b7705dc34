"""Benchmarks and comparisons: timing, memory, approximation error against exact softmax."""

from .compare import ComparisonRow, compare_mechanisms, format_table
from .timing import Timing, machine_info, measure_time, peak_memory_bytes

__all__ = [
    "ComparisonRow",
    "Timing",
    "compare_mechanisms",
    "format_table",
    "machine_info",
    "measure_time",
    "peak_memory_bytes",
]
