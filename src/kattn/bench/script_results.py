"""What the timing scripts of ``benchmarks/`` write alike: the sentence naming the machine a
run was measured on, and the files of a run (``<benchmark>-<machine>-<versions>``, with
``-quick`` after a smoke run so that it never stands in for a committed result)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .timing import results_stem, write_results


def machine_line(info: dict[str, Any]) -> str:
    """The sentence naming what ``info`` (:func:`~kattn.bench.timing.machine_info`) describes:
    processor, threads, torch, kattn and Python versions."""
    return (
        f"{info['processor']}, {info['torch_threads']} threads; torch {info['torch']}, "
        f"kattn {info['kattn']}, Python {info['python']}."
    )


def write_run(
    out: Path, benchmark: str, report: dict[str, Any], markdown: str, *, quick: bool
) -> Path:
    """Write ``report`` as JSON and ``markdown`` under ``out`` as
    :func:`~kattn.bench.timing.write_results` does, named by ``benchmark`` and the machine of
    ``report["machine"]``, with ``-quick`` after the name for a smoke run (``quick``)."""
    stem = results_stem(benchmark, report["machine"]) + ("-quick" if quick else "")
    return write_results(out, stem, report, markdown)
