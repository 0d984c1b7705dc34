"""Renderer of the shared-memory table of docs/performance.md: the Triton kernels compiled
ahead of time for sm_80 by ``tests/ops/test_triton_shared_memory.py`` before and after their
tiles were bounded (the two lists under ``benchmarks/results/triton-shared-memory/``)."""

from __future__ import annotations

import re

FOLDER = "benchmarks/results/triton-shared-memory"
BEFORE, AFTER = f"{FOLDER}/before.txt", f"{FOLDER}/after.txt"
#: one compiled launch: "<dtype> <module>:<kernel> sm<NN>: <bytes> B[, ...]"
LINE = re.compile(r"^torch\.(\w+) kattn\.ops\.triton\.\w+:(\w+) sm(\d+): (\d+) B")


def largest_launches(text: str, dtype: str = "float32", sm: str = "80") -> dict[str, int]:
    """Kernel → the largest shared memory of its launches with ``dtype`` inputs on ``sm``,
    in the order the list first names them."""
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if match and match[1] == dtype and match[3] == sm:
            sizes[match[2]] = max(sizes.get(match[2], 0), int(match[4]))
    return sizes


def shared_memory(before: str, after: str) -> str:
    """One row per kernel: its largest fp32 launch on sm_80, before and after."""
    old, new = largest_launches(before), largest_launches(after)
    lines = ["| kernel | before | after |", "| --- | ---: | ---: |"]
    for kernel, size in new.items():
        was = f"{old[kernel]:,} B" if kernel in old else "—"
        lines.append(f"| `{kernel}` | {was} | {size:,} B |")
    return "\n".join(lines)
