"""The approximation and stability studies run end to end: each runs one study of
:mod:`kattn.bench`, writes ``<stem>.csv``, ``.json``, ``.md`` and ``.png`` into a folder and
returns its rows and markdown (what ``kattn bench approx`` and ``kattn bench stability`` print).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..registry import available
from .approx import NORM_SWEEP_VARIANTS, norm_sweep, plot_norm_sweep, rows_to_csv, rows_to_markdown
from .kernel_error import KERNEL_VARIANTS, kernel_markdown, kernel_study, plot_kernel
from .mechanism_error import (
    approximate_mechanisms,
    mechanism_markdown,
    mechanism_study,
    plot_mechanisms,
)
from .spectral import (
    BERT_INIT_STD,
    SPECTRAL_PAIRS,
    plot_spectral,
    spectral_markdown,
    spectral_study,
)
from .stability import LEARNING_RATE, plot_stability, stability_markdown, stability_study
from .timing import machine_info

#: the studies of ``kattn bench approx --experiment``
EXPERIMENTS = ("norm-sweep", "spectral", "kernel", "mechanisms")


@dataclass(frozen=True)
class StudyOutput:
    """What one study measured and wrote: its rows, its markdown (also in ``<stem>.md``), the
    folder and the names of the files written there."""

    rows: list[Any]
    markdown: str
    out: Path
    files: tuple[str, ...]


def choose(names: Sequence[str] | None, known: Sequence[str], what: str) -> list[str]:
    """``names`` without repeats (None: every one of ``known``), each checked against ``known``."""
    chosen = list(dict.fromkeys(known if names is None else names))
    unknown = [x for x in chosen if x not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown or no {what} {unknown}; choose from {list(known)}")
    return chosen


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def write_study(
    out: Path,
    stem: str,
    rows: Sequence[Any],
    *,
    title: str,
    caption: str,
    table: str,
    plot: Callable[..., Path | None],
) -> StudyOutput:
    """``<stem>.csv``, ``.json`` (benchmark, machine, caption, rows), ``.md`` (``title``, the
    caption and ``table``) and ``.png``; the caption is ``caption`` followed by the versions of
    kattn and torch that measured it."""
    caption = f"{caption} {_versions()}"
    markdown = f"# {title}\n\n{caption}.\n\n{table}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.csv").write_text(rows_to_csv(list(rows)))
    report = {
        "benchmark": stem,
        "machine": machine_info(),
        "caption": caption,
        "rows": [{k: _json_value(v) for k, v in asdict(r).items()} for r in rows],
    }
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    png = plot(rows, out / f"{stem}.png", caption)
    written = [f"{stem}.csv", f"{stem}.json", f"{stem}.md"] + ([f"{stem}.png"] if png else [])
    return StudyOutput(list(rows), markdown, out, tuple(written))


def _json_value(value: Any) -> Any:
    """``value`` with non-finite floats as None (strict JSON has no NaN or infinity)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _versions() -> str:
    return f"kattn {machine_info()['kattn']}, torch {torch.__version__}"


#: the norm-sweep caption's words for each way of drawing W
_SAMPLED = {
    "iid": "with i.i.d. N(0, I) rows (as in the paper)",
    "orthogonal": "with orthogonal rows in blocks of d, Gaussian norms",
    "sphere": "with i.i.d. rows uniform on the sphere of radius √d",
}


def run_norm_sweep(
    out: Path,
    *,
    radii: tuple[float, ...],
    features: tuple[int, ...],
    dim: int,
    keys: int,
    seeds: int,
    variants: Sequence[str] | None = None,
    sampling: str = "iid",
    progress: Callable[[str], None] | None = None,
) -> StudyOutput:
    """Luo et al. 2021, Fig. 1b (:func:`~kattn.bench.approx.norm_sweep`) for ``variants``
    (labels of ``NORM_SWEEP_VARIANTS``; None: all), written as ``norm-sweep.*``."""
    known = {v[0]: v for v in NORM_SWEEP_VARIANTS}
    chosen = choose(variants, list(known), "variant(s)")
    rows = []
    for name in chosen:
        _say(progress, f"{name} ...")
        rows += norm_sweep(radii=radii, features=features, dim=dim, keys=keys, seeds=seeds,
                           variants=(known[name],), sampling=sampling)  # fmt: skip
    caption = (
        f"d={dim}, {keys} keys, one query, unit sphere × R; W {_SAMPLED[sampling]}; "
        f"mean over {seeds} seeds (bars: standard error of the mean)."
    )
    title = "Norm sweep (Luo et al. 2021, Fig. 1b)"
    return write_study(out, "norm-sweep", rows, title=title, caption=caption,
                       table=rows_to_markdown(rows), plot=plot_norm_sweep)  # fmt: skip


def run_spectral(
    out: Path,
    *,
    lengths: tuple[int, ...],
    features: tuple[int, ...],
    dim: int,
    heads: int,
    seeds: int,
    input_std: float = BERT_INIT_STD,
    mechanisms: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> StudyOutput:
    """Chen et al. 2021 §4.5, Fig. 1 (:func:`~kattn.bench.spectral.spectral_study`) for
    ``mechanisms`` (of ``SPECTRAL_PAIRS``; None: all), written as ``spectral.*``."""
    names = choose(mechanisms, [p[0] for p in SPECTRAL_PAIRS], "mechanism(s)")
    rows = spectral_study(
        lengths=lengths,
        features=features,
        head_dim=dim,
        heads=heads,
        seeds=seeds,
        input_std=input_std,
        pairs=tuple(pair for pair in SPECTRAL_PAIRS if pair[0] in names),
        progress=progress,
    )
    caption = (
        f"D=Dv={dim}, q, k, v entries N(0, {input_std:.3g}²); mean over {heads} "
        f"heads × {seeds} seeds (bars: standard error)."
    )
    title = "Spectral-norm approximation error (Chen et al. 2021 §4.5, Fig. 1)"
    return write_study(out, "spectral", rows, title=title, caption=caption,
                       table=spectral_markdown(rows), plot=plot_spectral)  # fmt: skip


def run_kernel(
    out: Path,
    *,
    features: tuple[int, ...],
    dim: int,
    keys: int,
    seeds: int,
    input_std: float = BERT_INIT_STD,
    variants: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> StudyOutput:
    """Every random-feature map of ``variants`` (labels of ``KERNEL_VARIANTS``; None: all)
    against its exact kernel (:func:`~kattn.bench.kernel_error.kernel_study`), written as
    ``kernel.*``."""
    known = {v.label: v for v in KERNEL_VARIANTS}
    chosen = choose(variants, list(known), "kernel variant(s)")
    rows = kernel_study(
        features=features,
        dim=dim,
        keys=keys,
        seeds=seeds,
        input_std=input_std,
        variants=tuple(known[name] for name in chosen),
        progress=progress,
    )
    caption = (
        f"D={dim}, {keys} queries × {keys} keys with N(0, {input_std:.3g}²) "
        f"entries, kernels at the softmax scale q·k/√D; mean over {seeds} seeds (bars: "
        "standard error), a fresh draw of inputs and features per seed."
    )
    title = "Random-feature maps against their exact kernels"
    return write_study(out, "kernel", rows, title=title, caption=caption,
                       table=kernel_markdown(rows), plot=plot_kernel)  # fmt: skip


def run_mechanisms(
    out: Path,
    *,
    lengths: tuple[int, ...],
    dim: int,
    heads: int,
    seeds: int,
    input_std: float = BERT_INIT_STD,
    mechanisms: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> StudyOutput:
    """Every approximate mechanism of ``mechanisms`` (None: all) against its exact counterpart
    (:func:`~kattn.bench.mechanism_error.mechanism_study`), written as ``mechanisms.*``."""
    names = choose(mechanisms, approximate_mechanisms(),
                   "approximate mechanism(s) (exact ones are the references)")  # fmt: skip
    rows = mechanism_study(names, lengths=lengths, head_dim=dim, heads=heads, seeds=seeds,
                           input_std=input_std, progress=progress)  # fmt: skip
    caption = (
        f"D=Dv={dim}, q, k entries N(0, {input_std:.3g}²), v N(0, 1); registered "
        f"defaults, eval(); mean over {heads} heads × {seeds} seeds (bars: standard "
        "error). Dashed: no exact counterpart, compared with softmax for information."
    )
    title = "Approximate mechanisms against their exact counterparts"
    return write_study(out, "mechanisms", rows, title=title, caption=caption,
                       table=mechanism_markdown(rows), plot=plot_mechanisms)  # fmt: skip


def run_stability(
    out: Path,
    *,
    mechanisms: Sequence[str],
    steps: int,
    seeds: int,
    batch: int = 8,
    length: int,
    lr: float = LEARNING_RATE,
    progress: Callable[[str], None] | None = None,
) -> StudyOutput:
    """Chen et al. 2021, Appendix F (:func:`~kattn.bench.stability.stability_study`): the
    instability score of ``mechanisms`` as a ratio to softmax, written as ``stability.*``."""
    names = choose(mechanisms, [n for n in available() if n != "softmax"], "mechanism(s)")
    if length <= 128:
        _say(
            progress,
            f"note: at length {length} <= 128 landmarks, skyformer and nystromformer take "
            "every token as a landmark (Nyströmformer is exact there)",
        )
    rows = stability_study(names, steps=steps, seeds=seeds, batch=batch, length=length, lr=lr,
                           progress=progress)  # fmt: skip
    caption = (
        f"2 pre-LN layers, width 64, 2 heads, MLP 128; batch {batch} × {length} "
        f"synthetic tokens; AdamW lr {lr:g}; {steps} steps, {seeds} seed(s)."
    )
    title = "Instability score (Chen et al. 2021, Appendix F, Table 3)"
    return write_study(out, "stability", rows, title=title, caption=caption,
                       table=stability_markdown(rows), plot=plot_stability)  # fmt: skip
