"""The measured numbers that README.md and docs/*.md quote, tied to the committed result files.

Every number in the documentation that reports a measurement is one of:

* in a **generated block**: a table rendered here from a result file, between
  ``<!-- generated from <file> by benchmarks/doc_numbers.py (<name>): do not edit -->`` and
  ``<!-- end generated -->``; ``--write`` renders it again;
* in a **quote**: a sentence written here as a template with one format field per number
  (``"performer **{:.1f}×** faster"``) and the values it takes from a result file; the page
  must contain the sentence with exactly those values, as formatted (line breaks and spaces
  are free), and ``--write`` puts the file's values into the page's sentence;
* in an **unrecorded** passage (``UNRECORDED``): a measurement whose result file is not
  committed yet, listed with what to commit so that a quote or a block can replace it (every
  run of this script says what is still missing);
* or it is not a measurement and listed in ``NOT_MEASURED`` with the reason (a setting, a
  count, a target, the size of a download).

A page must also cite every result file it quotes (its path, or the name with ``*`` for the
processor and versions). Pages listed in ``NOT_YET_CHECKED`` are not checked yet; move one
to ``PAGES`` once its numbers have quotes or blocks.

The check also looks for numbers with a unit of time, size, ratio or share (``ms``, ``MiB``,
``×``, ``%``…) and for decimals anywhere outside code, generated blocks, quotes and those
lists, so a number added to a page without a source fails.

    python benchmarks/doc_numbers.py            # check (exit 1 and a list of what is wrong)
    python benchmarks/doc_numbers.py --write    # rewrite blocks and quoted numbers from files

``tests/test_doc_numbers.py`` runs the check. After re-running a benchmark, commit its new
result file, run ``--write`` and read the diff: the prose around a number may need to change
with it (a "faster" that became "slower").
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import string
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROCESSOR = "intel-r-xeon-r-processor-torch2.13.0-kattn0.1.0"
MACHINE = f"cpu-{PROCESSOR}"
R = "benchmarks/results"
FOUNDATION = f"{R}/foundation-{MACHINE}.json"
RPE = f"{R}/rpe-{MACHINE}.json"
RPE_BLOCKED = f"{R}/rpe-blocked-{MACHINE}.json"
NYSTROM = f"{R}/nystrom-{MACHINE}.json"
LEARNED = f"{R}/learned-{MACHINE}.json"
LM = f"{R}/lm-{MACHINE}.json"
SPEED = f"{R}/speed/speed-forward-float32-{MACHINE}.json"
SPEED_RPE = f"{R}/speed-rpe/speed-forward-float32-{MACHINE}.json"
MECHANISMS = f"{R}/mechanisms/mechanisms.json"
NORM_SWEEP = f"{R}/norm-sweep/norm-sweep.csv"
SPECTRAL = f"{R}/spectral/spectral.csv"
STABILITY = f"{R}/stability/stability.json"
PINV_INIT = f"{R}/pinv-init-cpu-amd-epyc-torch2.13.0-kattn0.1.0.json"

#: pages whose numbers are not tied to result files yet (each to move to PAGES, with its quotes)
NOT_YET_CHECKED: tuple[str, ...] = ()
#: the pages checked: README.md and every page of docs/ but those above
PAGES = (
    "README.md",
    "docs/api.md",
    "docs/choosing-a-mechanism.md",
    "docs/feedforward-kernels.md",
    "docs/kernelized.md",
    "docs/language-modelling.md",
    "docs/learned-kernels.md",
    "docs/nystrom.md",
    "docs/performance.md",
    "docs/reproducing-lra.md",
    "docs/rpe.md",
    "docs/simpletron.md",
)


# ---------------------------------------------------------------------------------------------
# result files


@cache
def load(path: str) -> Any:
    """A result file: JSON as parsed, CSV as a list of rows (numbers converted)."""
    file = ROOT / path
    if path.endswith(".csv"):
        with file.open(newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return json.loads(file.read_text())


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def cited_as(path: str) -> tuple[str, ...]:
    """How a page may cite ``path``: the path, its other format (.md/.json), its folder for a
    study in its own folder, or the name with ``*`` (or ``…``) for the processor and versions."""
    names = {path, re.sub(r"\.json$", ".md", path)}
    if path.count("/") > 2:  # benchmarks/results/<study>/<file>
        names.add(path.rsplit("/", 1)[0] + "/")
    names |= {n.replace(PROCESSOR, "*") for n in names}
    names |= {n.split(PROCESSOR)[0] + "…" for n in names if PROCESSOR in n}
    return tuple(sorted(names))


def mib(nbytes: float) -> float:
    return nbytes / 2**20


# ---------------------------------------------------------------------------------------------
# what a page says


@dataclass(frozen=True)
class Quote:
    """A sentence of ``page`` with the numbers ``values(*files)`` in its format fields."""

    page: str
    sources: tuple[str, ...]
    template: str
    values: Callable[..., Sequence[Any]]

    def expected(self) -> str:
        return self.template.format(*self.values(*(load(s) for s in self.sources)))


@dataclass(frozen=True)
class Block:
    """A generated part of ``page``: ``render(*files)`` between the markers named ``name``."""

    page: str
    name: str
    sources: tuple[str, ...]
    render: Callable[..., str]

    def marker(self) -> str:
        return (
            f"<!-- generated from {', '.join(self.sources)} by benchmarks/doc_numbers.py "
            f"({self.name}): do not edit -->"
        )

    def expected(self) -> str:
        return self.render(*(load(s) for s in self.sources)).strip("\n")


@dataclass(frozen=True)
class Passage:
    """A passage of ``page`` (whitespace-insensitive); with ``table``, the passage opens a markdown
    table and the entry covers the whole table."""

    page: str
    passage: str
    table: bool

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the passage is (every occurrence), empty if nowhere."""
        return [self._extent(text, m) for m in re.finditer(_loose(self.passage), text)]

    def _extent(self, text: str, match: re.Match[str]) -> tuple[int, int]:
        if not self.table:
            return match.span()
        end = match.end()
        while True:  # to the end of the line, then of every following table row
            newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline
            if not text.startswith("\n|", end):
                return match.start(), end
            end += 1


@dataclass(frozen=True)
class Unrecorded(Passage):
    """Measurements with no committed result file yet: committing ``missing`` would let a
    quote or a block replace the entry."""

    missing: str


@dataclass(frozen=True)
class NotMeasured(Passage):
    """Numbers that are not measurements: settings, counts, sizes of data, targets."""

    reason: str


END = "<!-- end generated -->"
BLOCK_RE = re.compile(
    r"<!-- generated from (?P<sources>[^>]*?) by benchmarks/doc_numbers\.py \((?P<name>[\w-]+)\)"
    r": do not edit -->\n(?P<body>.*?)\n?" + re.escape(END),
    re.S,
)
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
#: a number worth a source: one with a unit of time, size, ratio or share, or a decimal
MEASURED = re.compile(
    r"(?<![\w.^/-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
    r"\s?(?:×|ms\b|µs\b|s\b|min\b|minutes\b|[KMG]i?B\b|%|GFLOP)"
    r"|(?<![\w.^/§-])(?<!Table )\d+\.\d+(?![\d.])"
)
CODE_RE = re.compile(r"```.*?```|`[^`]+`", re.S)


def _loose(text: str) -> str:
    """A regex for ``text`` in which any run of whitespace matches any run of whitespace."""
    return r"\s+".join(re.escape(part) for part in text.split())


def _template_regex(template: str) -> str:
    """A regex for ``template`` whose groups are its format fields (whitespace-insensitive)."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal.strip():
            lead = r"\s*" if literal[0].isspace() else ""
            trail = r"\s*" if literal[-1].isspace() else ""
            parts.append(lead + _loose(literal) + trail)
        elif literal:
            parts.append(r"\s+")
        if field is not None:
            parts.append(f"({NUMBER})")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# checking and writing


@dataclass
class Problem:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_page(page: str, text: str) -> tuple[list[Problem], list[tuple[int, int]]]:
    """What is wrong on ``page`` and the spans its quotes, blocks and lists account for."""
    problems: list[Problem] = []
    spans: list[tuple[int, int]] = []
    sources: set[str] = set()
    blocks = {m["name"]: m for m in BLOCK_RE.finditer(text)}
    for block in (b for b in BLOCKS if b.page == page):
        sources |= set(block.sources)
        found = blocks.pop(block.name, None)
        if found is None:
            problems.append(Problem(page, 1, f"no generated block {block.name!r}: add "
                                    f"{block.marker()} … {END} and run --write"))  # fmt: skip
            continue
        spans.append(found.span())
        if found["sources"] != ", ".join(block.sources):
            problems.append(Problem(page, _line(text, found.start()),
                                    f"block {block.name!r} names its sources wrongly"))  # fmt: skip
        if found["body"].strip("\n") != block.expected():
            problems.append(Problem(page, _line(text, found.start()),
                                    f"block {block.name!r} differs from its result file: "
                                    "run benchmarks/doc_numbers.py --write"))  # fmt: skip
    for name, found in blocks.items():
        problems.append(Problem(page, _line(text, found.start()), f"unknown block {name!r}"))
    for quote in (q for q in QUOTES if q.page == page):
        sources |= set(quote.sources)
        expected = quote.expected()
        match = re.search(_loose(expected), text)
        if match:
            spans.append(match.span())
            continue
        near = re.search(_template_regex(quote.template), text)
        where = _line(text, near.start()) if near else 1
        said = f"; the page says {' '.join(near[0].split())!r}" if near else ""
        problems.append(Problem(page, where, f"expected {expected!r} (from "
                                f"{', '.join(quote.sources)}){said}"))  # fmt: skip
    for entry in (e for e in [*UNRECORDED, *NOT_MEASURED] if e.page == page):
        covered = entry.spans(text)
        if not covered:
            kind = type(entry).__name__
            problems.append(Problem(page, 1, f"{kind} passage not found: {entry.passage!r}"))
        spans += covered
    for source in sorted(sources):
        if not any(name in text for name in cited_as(source)):
            problems.append(Problem(page, 1, f"quotes {source} but does not cite it "
                                    f"(one of {', '.join(cited_as(source))})"))  # fmt: skip
    spans += [m.span() for m in CODE_RE.finditer(text)]
    for match in MEASURED.finditer(text):
        if not any(a <= match.start() < b for a, b in spans):
            problems.append(Problem(page, _line(text, match.start()),
                                    f"{match[0]!r} has no source: quote it from a result "
                                    "file, or list it in benchmarks/doc_numbers.py"))  # fmt: skip
    return problems, spans


def check(pages: Sequence[str] = PAGES) -> list[Problem]:
    problems = []
    for page in pages:
        problems += check_page(page, (ROOT / page).read_text())[0]
    return problems


def write(pages: Sequence[str] = PAGES) -> list[str]:
    """Render every block and put every quote's values into its page; the pages changed."""
    changed = []
    for page in pages:
        path = ROOT / page
        text = path.read_text()
        new = rewrite_page(page, text)
        if new != text:
            path.write_text(new)
            changed.append(page)
    return changed


def rewrite_page(page: str, text: str) -> str:
    """``text`` of ``page`` with its blocks rendered again and its quotes' numbers taken from
    their files (a quote whose words changed is left to the check to report)."""
    for block in (b for b in BLOCKS if b.page == page):

        def replace(m: re.Match[str], block: Block = block) -> str:
            if m["name"] != block.name:
                return m[0]
            return f"{block.marker()}\n{block.expected()}\n{END}"

        text = BLOCK_RE.sub(replace, text)
    for quote in (q for q in QUOTES if q.page == page):
        if re.search(_loose(quote.expected()), text):
            continue
        matches = list(re.finditer(_template_regex(quote.template), text))
        if len(matches) != 1:
            continue
        values = quote.values(*(load(s) for s in quote.sources))
        specs = [s for _, f, s, _ in string.Formatter().parse(quote.template) if f is not None]
        m, pieces = matches[0], []
        last = m.start()
        for i, (value, spec) in enumerate(zip(values, specs, strict=True), start=1):
            pieces += [text[last : m.start(i)], format(value, spec or "")]
            last = m.end(i)
        text = text[: m.start()] + "".join(pieces) + text[last:]
    return text


# ---------------------------------------------------------------------------------------------
# renderers of generated blocks


def _times(d: dict, keys: Sequence[tuple[str, str]]) -> str:
    lines = ["| path | time (ms) |", "|---|---|"]
    lines += [f"| {label} | {1000 * d['seconds'][key]:.2f} |" for key, label in keys]
    return "\n".join(lines)


FOUNDATION_PATHS = (
    ("performer causal", "causal `performer` (chunkwise-parallel)"),
    ("softmax causal", "causal softmax, `scaled_dot_product_attention(is_causal=True)`"),
    ("cumsum causal", "causal linear attention by cumulative sum (same PRF features)"),
    ("performer", "non-causal `performer`"),
    ("softmax", "non-causal softmax"),
)
FOUNDATION_RATIOS = (
    ("causal: performer vs softmax", "causal: performer vs softmax"),
    ("causal: performer vs cumsum formulation", "causal: performer vs cumulative-sum formulation"),
    ("non-causal: performer vs softmax", "non-causal: performer vs softmax"),
)


def foundation_ratios(d: dict) -> str:
    lines = ["| ratio | measured (median) | per-round range | target |", "|---|---|---|---|"]
    for key, label in FOUNDATION_RATIOS:
        rounds = d["round_ratios"][key]
        lines.append(
            f"| {label} | **{d['ratios'][key]:.1f}×** | {min(rounds):.1f}–{max(rounds):.1f}× "
            f"| ≥ {d['targets'][key]:.0f}× |"
        )
    return "\n".join(lines)


def foundation_memory(d: dict) -> str:
    keys = [k for k, _ in FOUNDATION_PATHS]
    lines = [
        "| L | causal performer | causal softmax | causal cumsum | performer | softmax |",
        "|---|---|---|---|---|---|",
    ]
    for length, peaks in d["peak_memory_bytes"].items():
        cells = [f"{mib(peaks[k]):.1f}" if k in peaks else "(not run)" for k in keys]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_foundation(d: dict) -> str:
    ms = {k: 1000 * v for k, v in d["seconds"].items()}

    def ratio(key: str) -> str:
        rounds = d["round_ratios"][key]
        return (
            f"performer **{d['ratios'][key]:.1f}×** faster ({min(rounds):.1f}–{max(rounds):.1f}×)"
        )

    return "\n".join(
        [
            "| | time | ratio |",
            "|---|---|---|",
            f"| causal `performer` (chunkwise-parallel) | {ms['performer causal']:.1f} ms | |",
            f"| causal softmax (`scaled_dot_product_attention`) | {ms['softmax causal']:.0f} ms "
            f"| {ratio('causal: performer vs softmax')} |",
            f"| causal linear attention by cumulative sum | {ms['cumsum causal']:.0f} ms "
            f"| {ratio('causal: performer vs cumsum formulation')} |",
            f"| non-causal `performer` | {ms['performer']:.1f} ms | |",
            f"| non-causal softmax | {ms['softmax']:.0f} ms "
            f"| {ratio('non-causal: performer vs softmax')} |",
        ]
    )


def _ms(seconds: float | None) -> str:
    """Milliseconds to about three significant digits, with a thousands separator."""
    if seconds is None:
        return "—"
    value = 1000 * seconds
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def rpe_blocked(d: dict) -> str:
    cells: dict[tuple[int, int], dict[str, dict]] = {}
    for row in d["rows"]:
        cells.setdefault((row["features"], row["length"]), {})[row["mode"]] = row
    lines = [
        "| M | L | forward: blocked / FFT (ms) | causal forward | causal training step "
        "| auto picks |",
        "|---|---|---|---|---|---|",
    ]
    for (m, length), modes in cells.items():
        parts = []
        for mode in ("forward", "forward causal", "train causal"):
            row = modes[mode]
            blocked, fft = row["blocked_seconds"], row["fft_seconds"]
            text = f"{_ms(blocked)} / {_ms(fft)}"
            if fft is not None:
                text += f" ({_times_x(fft / blocked)})"
            parts.append(text)
        picks = {modes[mode]["auto_picks"] for mode in ("forward", "forward causal")}
        auto = (
            "blocked"
            if picks == {"blocked"}
            else f"{modes['forward']['auto_picks']} forward, "
            f"{modes['forward causal']['auto_picks']} causal"
        ).replace("fft", "FFT")
        lines.append(f"| {m} | {length:,} | " + " | ".join(parts) + f" | {auto} |")
    return "\n".join(lines)


def norm_sweep(variant: str) -> Callable[[list[dict]], str]:
    def render(rows: list[dict]) -> str:
        mine = [r for r in rows if r["variant"] == variant]
        radii = sorted({r["radius"] for r in mine})
        features = sorted({r["features"] for r in mine})
        error = {(r["radius"], r["features"]): r["l1_error"] for r in mine}
        seeds = mine[0]["seeds"]
        lines = [
            f"**{variant}**: mean ‖A − Â‖₁ over {seeds} seeds",
            "",
            "| R | " + " | ".join(f"M={m}" for m in features) + " |",
            "|---|" + "---|" * len(features),
        ]
        for radius in radii:
            cells = " | ".join(f"{error[radius, m]:.3f}" for m in features)
            lines.append(f"| {radius:g} | {cells} |")
        return "\n".join(lines)

    return render


def rpe_sweep(d: dict) -> str:
    sweep = d["sweep_seconds"]
    lengths = [n for n in sweep if n != "512"]  # every length but one, to fit the page
    ratio = {n: sweep[n]["dense"] / sweep[n]["fft"] for n in lengths}
    best = max(lengths, key=lambda n: ratio[n])
    return "\n".join(
        [
            "| L | " + " | ".join(lengths) + " |",
            "|---|" + "---|" * len(lengths),
            "| FFT (ms) | " + " | ".join(_ms3(sweep[n]["fft"]) for n in lengths) + " |",
            "| blocked (ms) | " + " | ".join(_ms3(sweep[n]["dense"]) for n in lengths) + " |",
            "| blocked / FFT | "
            + " | ".join(
                (f"**{ratio[n]:.2g}×**" if n == best and ratio[n] > 1 else f"{ratio[n]:.2g}×")
                for n in lengths
            )
            + " |",
        ]
    )


def _ms3(seconds: float) -> str:
    """Milliseconds to three significant digits, no exponent."""
    return _sig3(1000 * seconds)


def _sig3(value: float) -> str:
    """Three significant digits (trailing zeros kept), no exponent."""
    return f"{value:,.0f}" if value >= 100 else f"{value:#.3g}"


def rpe_paths(d: dict) -> str:
    ms = {k: 1000 * v for k, v in d["seconds"].items()}
    ratio, rounds = d["ratios"], d["round_ratios"]

    def measured(key: str, word: str = "") -> str:
        return f"**{ratio[key]:.3g}×**{word} ({min(rounds[key]):.1f}–{max(rounds[key]):.1f}×)"

    def row(label: str, key: str, note: str = "") -> str:
        plain, causal = _sig3(ms[f"{key} non-causal"]), _sig3(ms[f"{key} causal"])
        return f"| {label} | {plain} ms | {causal} ms{note} |"

    return "\n".join(
        [
            "| path | non-causal | causal |",
            "|---|---|---|",
            row("`bucketed` (banded, exact)", "banded"),
            row("`toeplitz` (FFT)", "fft", " (fp64 products)"),
            row("`decay` (chunked recurrences, 3 terms)", "decay"),
            row("plain `performer`, same M", "performer"),
            f"| banded vs FFT | {measured('non-causal: banded vs FFT', ' faster')} "
            f"| {measured('causal: banded vs FFT', ' faster')} |",
            f"| banded / performer | {measured('non-causal: banded / performer')} "
            f"| {measured('causal: banded / performer')} |",
        ]
    )


def rpe_decode(d: dict) -> str:
    per_token = d["decode_seconds_per_token"]
    positions = list(per_token["decay"])
    ratio = d["ratios"]["decode: decay step at L / at 128"]
    labels = {"decay": "`decay`", "banded": "`bucketed`", "performer": "`performer` (no positions)"}
    lines = [
        "| | " + " | ".join(f"at position {p}" for p in positions) + " |",
        "|---|" + "---|" * len(positions),
    ]
    for key, label in labels.items():
        cells = [f"{1e6 * per_token[key][p]:.0f} µs" for p in positions]
        if key == "decay":
            cells[-1] += f" ({ratio:.2f}×)"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learned_table(d: dict) -> str:
    at = d["seconds"]["4096"]
    rounds = d["round_seconds"]["4096"]
    lines = [
        "| mechanism | features | time (ms) | speed-up (per-round range) |",
        "|---|---|---|---|",
    ]
    for name in ("gmm_rks", "gmm_prf", "fastfood_rks", "fastfood_prf", "generative_rks",
                 "generative_prf"):  # fmt: skip
        per_round = [s / m for s, m in zip(rounds["softmax"], rounds[name], strict=True)]
        lines.append(
            f"| `{name}` | {d['features'][name]} | {1000 * at[name]:.1f} | "
            f"{at['softmax'] / at[name]:.2f}× ({min(per_round):.1f}–{max(per_round):.1f}) |"
        )
    return "\n".join(lines)


LM_NAMES = ("softmax", "performer", "performer M=64", "nprf_rpe decay M=64")


def lm_decode(d: dict) -> str:
    rows = {(r["batch"], r["context"], r["mechanism"]): r for r in d["decode"]}
    lines = [
        "| B | context | `softmax` (KV cache) | `performer` (M=256) | `performer` M=64 "
        "| `nprf_rpe` decay, M=64 |",
        "|---|---|---|---|---|---|",
    ]
    for batch, context in ((1, 512), (1, 8192), (16, 512), (16, 2048), (16, 8192)):
        cells = []
        for name in LM_NAMES:
            row = rows[batch, context, name]
            ms, size = 1000 * row["step_seconds"], mib(row["state_bytes_filled"])
            cells.append(f"{_sig3(ms)} ms, {_size(size)} MiB")
        lines.append(f"| {batch} | {context} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _size(megabytes: float) -> str:
    return f"{megabytes:,.0f}" if megabytes >= 10 else f"{megabytes:#.2g}"


def lm_train(d: dict) -> str:
    rows = {(r["block"], r["mechanism"]): r for r in d["train"]}
    names = (*LM_NAMES, "no attention (ceiling)")
    lines = [
        "| block | `softmax` | `performer` | `performer` M=64 | `nprf_rpe` decay M=64 "
        "| no attention |",
        "|---|---|---|---|---|---|",
    ]
    for block in sorted({b for b, _ in rows}):
        base = rows[block, "softmax"]["tokens_per_second"]
        cells = [f"{base:,.0f}"]
        for name in names[1:]:
            tps = rows[block, name]["tokens_per_second"]
            cells.append(f"{tps:,.0f} ({tps / base:.2f}×)")
        lines.append(f"| {block} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _times_x(ratio: float) -> str:
    """A ratio to two significant digits, without an exponent."""
    return f"{ratio:.0f}×" if ratio >= 100 else f"{ratio:.2g}×"


def choosing_table(speed: dict, speed_rpe: dict, errors: dict) -> str:
    """Error, speed-up and memory of every mechanism; prf_rpe and nprf_rpe from their own
    run (footnote ¹ of the page)."""
    rows = [r for r in speed["rows"] if r["mechanism"] not in ("prf_rpe", "nprf_rpe")]
    rows += [r for r in speed_rpe["rows"] if r["mechanism"] != "softmax"]
    cross = {c["mechanism"]: c for c in speed["crossovers"] + speed_rpe["crossovers"]}
    lengths = speed["config"]["lengths"]
    error = {r["mechanism"]: r for r in errors["rows"] if r["length"] == 1024 and not r["causal"]}
    names = ["softmax", *sorted({r["mechanism"] for r in rows} - {"softmax"})]
    at = {(r["mechanism"], r["length"]): r for r in rows}
    short = [f"{n // 1024}K" for n in lengths]
    lines = [
        "| mechanism | error vs exact (L=1K) | "
        + " | ".join(f"speed-up {s}" for s in short)
        + " | "
        + " | ".join(f"memory {s}" for s in short)
        + " | faster from L |",
        "|---|---|" + "---|" * (2 * len(lengths)) + "---|",
    ]
    for name in names:
        if name not in error:  # the error study skips exact mechanisms
            err = "exact"
        elif error[name]["counterpart"]:
            err = f"{error[name]['rel_error']:.3f}"
        else:
            err = f"({error[name]['rel_error']:.3f} vs softmax)"
        speedups = [_times_x(at[name, n]["speedup"]) for n in lengths]
        memory = [_times_x(at[name, n]["memory_ratio"]) for n in lengths]
        if name == "softmax":
            crossover = "baseline"
        else:
            c = cross[name]
            sign = {"at": "≈", "below": "<", "above": ">"}[c["kind"]]
            crossover = f"{sign} {c['length']:,.0f}"
        label = f"{name} ¹" if name in ("prf_rpe", "nprf_rpe") else name
        lines.append(f"| {label} | {err} | " + " | ".join(speedups + memory) + f" | {crossover} |")
    return "\n".join(lines)


NYSTROM_NAMES = ("softmax", "softmax (materialised)", "skyformer", "nystromformer", "linformer",
                 "performer")  # fmt: skip


def _one_decimal(value: float) -> str:
    """One decimal below 100, none (with a thousands separator) from 100 on."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def nystrom_speed(d: dict) -> str:
    lines = [
        "| L | softmax | materialised | skyformer | nystromformer | linformer | performer |",
        "|---|---|---|---|---|---|---|",
    ]
    for length, seconds in d["seconds"].items():
        cells = [f"{_one_decimal(1000 * seconds[n])} ms" for n in NYSTROM_NAMES]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    peaks = d["peak_memory_bytes"]["4096"]
    cells = [_one_decimal(mib(peaks[n])) for n in NYSTROM_NAMES]
    lines.append("| peak MiB at 4096 | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SPECTRAL_LABELS = {"skyformer": "skyformer vs gaussian",
                   "nystromformer": "nystromformer vs softmax",
                   "performer": "performer vs softmax",
                   "linformer": "linformer vs softmax (untrained)"}  # fmt: skip


def spectral_table(rows: list[dict], length: int = 1024) -> str:
    mine = [r for r in rows if r["length"] == length]
    features = sorted({r["features"] for r in mine})
    error = {(r["mechanism"], r["features"]): r["rel_error"] for r in mine}
    lines = ["| m | " + " | ".join(map(str, features)) + " |", "|---|" + "---|" * len(features)]
    for name, label in SPECTRAL_LABELS.items():
        lines.append(f"| {label} | " + " | ".join(_sig3(error[name, m]) for m in features) + " |")
    return "\n".join(lines)


#: the instability scores of Chen et al. 2021, Appendix F, Table 3, over the LRA tasks
STABILITY_PAPER = {"nystromformer": "0.97–1.03", "gaussian": "0.62–0.83", "skyformer": "0.64–0.81"}


def _per_seed(d: dict, name: str) -> list[float]:
    """The mean ratio to softmax over the steps of each seed (as kattn.bench.stability)."""
    seeds: dict[int, list[float]] = {}
    for row in d["rows"]:
        if row["mechanism"] == name:
            seeds.setdefault(row["seed"], []).append(row["ratio"])
    return [statistics.mean(seeds[s]) for s in sorted(seeds)]


def stability_table(d: dict) -> str:
    lines = ["| mechanism | τ ratio to softmax | paper (LRA tasks) |", "|---|---|---|"]
    for name, paper in STABILITY_PAPER.items():
        per_seed = _per_seed(d, name)
        mean, spread = statistics.mean(per_seed), statistics.stdev(per_seed)
        lines.append(f"| {name} | {mean:.3f} ± {spread:.3f} | {paper} |")
    return "\n".join(lines)


def _small(value: float) -> str:
    """Three significant digits from 0.01 on, two below, an exponent at rounding level."""
    if value < 1e-6:
        return f"{value:.1e}"
    return f"{value:#.3g}" if value >= 0.01 else f"{value:#.2g}"


def pinv_approximation(d: dict) -> str:
    lines = [
        "| L | start | inverse | output vs `gaussian` | output vs exact inverse |",
        "|---|---|---|---|---|",
    ]
    for r in d["approximation"]:
        if r["init"] != "exact inverse":
            lines.append(
                f"| {r['length']} | {r['init']} | {_small(r['inverse'])} | "
                f"{r['vs_gaussian']:.4f} | {_small(r['vs_exact_inverse'])} |"
            )
    return "\n".join(lines)


def pinv_training(d: dict) -> str:
    lines = [
        "| start | non-finite steps | gradient norm, median / max | loss, last 20 steps "
        "| held-out accuracy | τ / τ(softmax) |",
        "|---|---|---|---|---|---|",
    ]
    for init, s in d["training"]["summary"].items():
        lines.append(
            f"| {init} | {s['non_finite_steps']} | {s['median_grad_norm']:.2f} / "
            f"{s['max_grad_norm']:.2f} | {s['final_loss']:.3f} | {s['accuracy']:.3f} | "
            f"{s['tau_ratio_to_softmax']:.3f} |"
        )
    return "\n".join(lines)


BLOCKS: list[Block] = [
    Block("README.md", "foundation", (FOUNDATION,), readme_foundation),
    Block("docs/performance.md", "foundation-times", (FOUNDATION,),
          lambda d: _times(d, FOUNDATION_PATHS)),
    Block("docs/performance.md", "foundation-ratios", (FOUNDATION,), foundation_ratios),
    Block("docs/performance.md", "foundation-memory", (FOUNDATION,), foundation_memory),
    Block("docs/rpe.md", "rpe-blocked", (RPE_BLOCKED,), rpe_blocked),
    Block("docs/rpe.md", "norm-sweep-prf", (NORM_SWEEP,), norm_sweep("prf")),
    Block("docs/rpe.md", "norm-sweep-trf", (NORM_SWEEP,), norm_sweep("trf")),
    Block("docs/rpe.md", "norm-sweep-nprf", (NORM_SWEEP,), norm_sweep("nprf")),
    Block("docs/rpe.md", "rpe-sweep", (RPE,), rpe_sweep),
    Block("docs/rpe.md", "rpe-paths", (RPE,), rpe_paths),
    Block("docs/rpe.md", "rpe-decode", (RPE,), rpe_decode),
    Block("docs/learned-kernels.md", "learned", (LEARNED,), learned_table),
    Block("docs/language-modelling.md", "lm-decode", (LM,), lm_decode),
    Block("docs/language-modelling.md", "lm-train", (LM,), lm_train),
    Block("docs/choosing-a-mechanism.md", "mechanisms", (SPEED, SPEED_RPE, MECHANISMS),
          choosing_table),
    Block("docs/nystrom.md", "nystrom-speed", (NYSTROM,), nystrom_speed),
    Block("docs/nystrom.md", "spectral", (SPECTRAL,), spectral_table),
    Block("docs/nystrom.md", "stability", (STABILITY,), stability_table),
    Block("docs/nystrom.md", "pinv-init-approximation", (PINV_INIT,), pinv_approximation),
    Block("docs/nystrom.md", "pinv-init-training", (PINV_INIT,), pinv_training),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# values quoted in sentences


def _ratio(d: dict, key: str) -> float:
    return float(d["ratios"][key])


def _nystrom(d: dict, name: str, baseline: str = "softmax", length: str = "4096") -> float:
    return d["seconds"][length][baseline] / d["seconds"][length][name]


def _nystrom_range(d: dict, name: str, length: str = "4096") -> tuple[float, float]:
    rounds = d["round_seconds"][length]
    per_round = [s / m for s, m in zip(rounds["softmax"], rounds[name], strict=True)]
    return min(per_round), max(per_round)


def _nystrom_memory(d: dict, name: str, length: str = "4096") -> float:
    peaks = d["peak_memory_bytes"][length]
    return 100 * peaks[name] / peaks["softmax (materialised)"]


def _learned(d: dict, name: str) -> float:
    at = d["seconds"]["4096"]
    return at["softmax"] / at[name]


FFK = ("ffk_linear", "ffk_fcnn", "ffk_glu", "ffk_oglu", "ffk_aoglu", "ffk_ae", "ffk_vae")


def _learned_min_round(d: dict) -> float:
    rounds = d["round_seconds"]["4096"]
    return min(
        s / m
        for name in rounds
        if name != "softmax"
        for s, m in zip(rounds["softmax"], rounds[name], strict=True)
    )


def _spectral(rows: list[dict], features: int, length: int = 1024) -> float:
    (row,) = (
        r
        for r in rows
        if r["mechanism"] == "skyformer" and r["length"] == length and r["features"] == features
    )
    return float(row["rel_error"])


def _lm(d: dict, batch: int, context: int, name: str) -> dict:
    (row,) = (
        r
        for r in d["decode"]
        if (r["batch"], r["context"], r["mechanism"]) == (batch, context, name)
    )
    return row


def _lm_ratio(d: dict, name: str, batch: int = 16, context: int = 8192) -> float:
    return (
        _lm(d, batch, context, "softmax")["step_seconds"]
        / _lm(d, batch, context, name)["step_seconds"]
    )


def _lm_target(d: dict, name: str) -> dict:
    (row,) = (t for t in d["targets"] if t["name"] == name)
    return row


def _lm_train(d: dict, block: int, name: str) -> dict:
    (row,) = (r for r in d["train"] if (r["block"], r["mechanism"]) == (block, name))
    return row


def _speed(d: dict, name: str, length: int) -> dict:
    (row,) = (r for r in d["rows"] if (r["mechanism"], r["length"]) == (name, length))
    return row


def _crossover(d: dict, name: str) -> float:
    (row,) = (c for c in d["crossovers"] if c["mechanism"] == name)
    return float(row["length"])


def _error(d: dict, name: str, length: int = 1024) -> float:
    (row,) = (
        r for r in d["rows"] if (r["mechanism"], r["length"], r["causal"]) == (name, length, False)
    )
    return float(row["rel_error"])


def _blocked(d: dict, features: int, length: int, mode: str) -> float:
    (row,) = (
        r for r in d["rows"] if (r["features"], r["length"], r["mode"]) == (features, length, mode)
    )
    return row["fft_seconds"] / row["blocked_seconds"]


def _doublings(rows: list[dict]) -> list[float]:
    """Skyformer's spectral error at 2m over that at m, every length and m."""
    sky = {(r["length"], r["features"]): r["rel_error"] for r in rows
           if r["mechanism"] == "skyformer"}  # fmt: skip
    return [e / sky[n, m // 2] for (n, m), e in sky.items() if (n, m // 2) in sky]


def _pinv(d: dict, length: int, init: str) -> dict:
    (row,) = (r for r in d["approximation"] if (r["length"], r["init"]) == (length, init))
    return row


def _exponent(value: float) -> str:
    """``1e-3`` rather than ``1e-03``."""
    return re.sub(r"e([-+])0*", r"e\1", f"{value:.0e}")


def _largest_gradient_step(d: dict, init: str, seed: int) -> int:
    """The step (counted from 1) of the largest gradient norm of a training run."""
    norms = d["training"]["runs"][init][seed]["grad_norms"]
    return 1 + max(range(len(norms)), key=norms.__getitem__)


QUOTES: list[Quote] = [
    # README.md
    Quote("README.md", (LM,),
          "`performer` decodes {:.0f}× faster per token than `softmax`'s key/value cache "
          "({:.0f}× with M=64), from a state {:.0f}× smaller ({:.0f} MiB against {:,.0f} MiB; "
          "{:.1f} MiB with M=64",
          lambda d: (_lm_ratio(d, "performer"), _lm_ratio(d, "performer M=64"),
                     _lm(d, 16, 8192, "softmax")["state_bytes_filled"]
                     / _lm(d, 16, 8192, "performer")["state_bytes_filled"],
                     mib(_lm(d, 16, 8192, "performer")["state_bytes_filled"]),
                     mib(_lm(d, 16, 8192, "softmax")["state_bytes_filled"]),
                     mib(_lm(d, 16, 8192, "performer M=64")["state_bytes_filled"]))),
    Quote("README.md", (RPE,),
          "the exact banded path of `rpe=\"bucketed\"` is {:.0f}× faster than the FFT algorithm "
          "of the paper at L=16384 and within {:.1f}× of plain `performer`",
          lambda d: (_ratio(d, "non-causal: banded vs FFT"),
                     _ratio(d, "non-causal: banded / performer"))),
    Quote("README.md", (RPE,),
          "({:.0f} µs at position 128, {:.0f} µs at 16320)",
          lambda d: (1e6 * d["decode_seconds_per_token"]["decay"]["128"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["16320"])),
    Quote("README.md", (NYSTROM,),
          "`nystromformer` {:.1f}× and `skyformer` {:.1f}× faster than PyTorch's fused softmax "
          "({:.1f}–{:.1f}× and {:.1f}–{:.1f}× per round), {:.0f}× and {:.0f}× faster than "
          "materialised softmax with {:.0f}% and {:.0f}% of its memory",
          lambda d: (_nystrom(d, "nystromformer"), _nystrom(d, "skyformer"),
                     *_nystrom_range(d, "nystromformer"), *_nystrom_range(d, "skyformer"),
                     _nystrom(d, "nystromformer", "softmax (materialised)"),
                     _nystrom(d, "skyformer", "softmax (materialised)"),
                     _nystrom_memory(d, "nystromformer"), _nystrom_memory(d, "skyformer"))),
    Quote("README.md", (SPECTRAL,),
          "({:.2f} → {:.3f} relative spectral error from 16 to 256 at L=1024",
          lambda rows: (_spectral(rows, 16), _spectral(rows, 256))),
    Quote("README.md", (LEARNED,),
          "`gmm_rks` {:.1f}×, `gmm_prf` {:.1f}×, `fastfood_rks` {:.1f}×, `fastfood_prf` {:.1f}×, "
          "`generative_rks` {:.1f}×, `generative_prf` {:.1f}×, feed-forward kernels "
          "{:.1f}–{:.1f}×, `simpletron` {:.0f}× faster",
          lambda d: (*(_learned(d, n) for n in ("gmm_rks", "gmm_prf", "fastfood_rks",
                                                "fastfood_prf", "generative_rks",
                                                "generative_prf")),
                     min(_learned(d, n) for n in FFK), max(_learned(d, n) for n in FFK),
                     _learned(d, "simpletron"))),
    Quote("README.md", (FOUNDATION,),
          "{:.0f} MiB for causal `performer` at L=8192, where the cumulative-sum formulation "
          "needs {:.0f} MiB",
          lambda d: (mib(d["peak_memory_bytes"]["8192"]["performer causal"]),
                     mib(d["peak_memory_bytes"]["8192"]["cumsum causal"]))),
    # docs/performance.md
    Quote("docs/performance.md", (FOUNDATION,),
          "needs L·M·Dv numbers, {:.0f} MiB at L=8192",
          lambda d: (mib(d["peak_memory_bytes"]["8192"]["cumsum causal"]),)),
    Quote("docs/performance.md", (FOUNDATION,),
          "roughly 6 ms of the {:.1f} ms",
          lambda d: (1000 * d["seconds"]["performer causal"],)),
    Quote("docs/performance.md", (RPE,),
          "is {:.1f}× faster than the FFT path of `rpe=\"toeplitz\"` non-causal ({:.1f}× causal) "
          "and takes {:.2f}× the time of plain `performer` non-causal ({:.2f}× causal)",
          lambda d: (_ratio(d, "non-causal: banded vs FFT"), _ratio(d, "causal: banded vs FFT"),
                     _ratio(d, "non-causal: banded / performer"),
                     _ratio(d, "causal: banded / performer"))),
    Quote("docs/performance.md", (RPE,),
          "the FFT path beats the blocked exact form from L = {} on ({:.1f}× faster at "
          "L = 16384); `decay` decoding costs {:.0f} µs per token at position 128 and {:.0f} µs "
          "at 16320",
          lambda d: (d["fft_vs_dense_crossover_length"],
                     d["sweep_seconds"]["16384"]["dense"] / d["sweep_seconds"]["16384"]["fft"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["128"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["16320"])),
    Quote("docs/performance.md", (NYSTROM,),
          "`nystromformer` {:.1f}× and `skyformer` {:.1f}× faster than the fused softmax (per "
          "round {:.1f}–{:.1f}× and {:.1f}–{:.1f}×), {:.0f}× and {:.0f}× faster than the "
          "materialised softmax with {:.0f}% and {:.0f}% of its peak memory",
          lambda d: (_nystrom(d, "nystromformer"), _nystrom(d, "skyformer"),
                     *_nystrom_range(d, "nystromformer"), *_nystrom_range(d, "skyformer"),
                     _nystrom(d, "nystromformer", "softmax (materialised)"),
                     _nystrom(d, "skyformer", "softmax (materialised)"),
                     _nystrom_memory(d, "nystromformer"), _nystrom_memory(d, "skyformer"))),
    Quote("docs/performance.md", (LEARNED,),
          "against the fused softmax ({:.1f} ms), one run, medians of 7 interleaved rounds: every "
          "one is faster — `gmm_rks` {:.1f}×, `gmm_prf` {:.1f}×, `fastfood_rks` {:.1f}×, "
          "`fastfood_prf` {:.1f}×, `generative_rks` {:.1f}×, `generative_prf` {:.1f}×, the "
          "feed-forward kernels {:.1f}–{:.1f}× (`ffk_vae` {:.1f}×), `simpletron` {:.0f}×; the "
          "slowest single round of any of them was {:.1f}×",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],
                     *(_learned(d, n) for n in ("gmm_rks", "gmm_prf", "fastfood_rks",
                                                "fastfood_prf", "generative_rks",
                                                "generative_prf")),
                     min(_learned(d, n) for n in FFK if n != "ffk_vae"),
                     max(_learned(d, n) for n in FFK), _learned(d, "ffk_vae"),
                     _learned(d, "simpletron"), _learned_min_round(d))),
    # docs/learned-kernels.md and docs/feedforward-kernels.md
    Quote("docs/learned-kernels.md", (LEARNED,),
          "against PyTorch's fused softmax ({:.1f} ms)",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],)),
    Quote("docs/feedforward-kernels.md", (LEARNED,),
          "against the fused softmax ({:.1f} ms), medians of 7 interleaved rounds "
          "(`benchmarks/learned_speed.py`, `benchmarks/results/learned-cpu-*.md`): "
          + ", ".join(f"`{n}` {{:.1f}} ms ({{:.1f}}×)" for n in FFK) + ".",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],
                     *(v for n in FFK for v in (1000 * d["seconds"]["4096"][n],
                                                _learned(d, n))))),
    # docs/rpe.md
    Quote("docs/rpe.md", (RPE,),
          "At M = 32 the FFT wins non-causal from L = {} on",
          lambda d: (d["fft_vs_dense_crossover_length"],)),
    # docs/language-modelling.md
    Quote("docs/language-modelling.md", (LM,),
          "`performer` at context 8192 takes {:.2f}× (B=1) and {:.2f}× (B=16) its time at 512",
          lambda d: (_lm_target(d, "decode B=1: performer at 8192 / at 512")["value"],
                     _lm_target(d, "decode B=16: performer at 8192 / at 512")["value"])),
    Quote("docs/language-modelling.md", (LM,),
          "({:,.0f} MiB for 16 sequences at 8192 tokens)",
          lambda d: (mib(_lm(d, 16, 8192, "softmax")["state_bytes_filled"]),)),
    Quote("docs/language-modelling.md", (LM,),
          "`softmax` is **{:.1f}× slower per token than `performer`** with its default 256 "
          "features (per round {:.1f}–{:.1f}×), **{:.1f}×** slower than `performer` with M=64",
          lambda d: (_lm_ratio(d, "performer"),
                     *(f(_lm_target(d, "decode B=16: softmax / performer at context 8192")
                         ["rounds"]) for f in (min, max)),
                     _lm_ratio(d, "performer M=64"))),
    Quote("docs/language-modelling.md", (LM,),
          "and **{:.1f}×** slower than `nprf_rpe` with `rpe=\"decay\"`",
          lambda d: (_lm_ratio(d, "nprf_rpe decay M=64"),)),
    Quote("docs/language-modelling.md", (LM,),
          "at B=16 the recurrent state is {:.0f} MiB per layer",
          lambda d: (mib(_lm(d, 16, 8192, "performer")["state_bytes_filled"])
                     / d["config"]["depth"],)),
    Quote("docs/language-modelling.md", (LM,),
          "At B=1 the ratio at 8192 is only {:.1f}×",
          lambda d: (_lm_ratio(d, "performer", batch=1),)),
    Quote("docs/language-modelling.md", (LM,),
          "than `softmax`'s {:.2f} ms here",
          lambda d: (1000 * _lm(d, 1, 8192, "softmax")["step_seconds"],)),
    Quote("docs/language-modelling.md", (LM,),
          "without any attention the step is only {:.2f}× faster than `softmax`'s, because "
          "`softmax` (PyTorch's fused `scaled_dot_product_attention`) spends {:.2f} s of its "
          "{:.2f} s step on attention and the shared {:.2f} s stays",
          lambda d: (_lm_train(d, 4096, "no attention (ceiling)")["tokens_per_second"]
                     / _lm_train(d, 4096, "softmax")["tokens_per_second"],
                     _lm_train(d, 4096, "softmax")["step_seconds"]
                     - _lm_train(d, 4096, "no attention (ceiling)")["step_seconds"],
                     _lm_train(d, 4096, "softmax")["step_seconds"],
                     _lm_train(d, 4096, "no attention (ceiling)")["step_seconds"])),
    Quote("docs/language-modelling.md", (LM,),
          "`performer` M=64 is {:.2f}× at 8192 tokens",
          lambda d: (_lm_train(d, 8192, "performer M=64")["tokens_per_second"]
                     / _lm_train(d, 8192, "softmax")["tokens_per_second"],)),
    Quote("docs/language-modelling.md", (LM,),
          "while `softmax`'s grows {:.1f}×",
          lambda d: (_lm_train(d, 8192, "softmax")["step_seconds"]
                     / _lm_train(d, 1024, "softmax")["step_seconds"],)),
    # docs/nystrom.md
    Quote("docs/nystrom.md", (NYSTROM,),
          "Skyformer is **{:.1f}×** faster (per round {:.1f}–{:.1f}×) and Nyströmformer "
          "**{:.1f}×** ({:.1f}–{:.1f}×). The margin over the {:.0f}× target is thin",
          lambda d: (_nystrom(d, "skyformer"), *_nystrom_range(d, "skyformer"),
                     _nystrom(d, "nystromformer"), *_nystrom_range(d, "nystromformer"),
                     d["targets"]["speedup_at_least"])),
    Quote("docs/nystrom.md", (NYSTROM,),
          "Against the materialised softmax they are {:.0f}× and {:.0f}× faster and take {:.0f}% "
          "and {:.0f}% of its memory. They cannot take less memory than the fused kernel, whose "
          "peak ({:.1f} MiB)",
          lambda d: (_nystrom(d, "skyformer", "softmax (materialised)"),
                     _nystrom(d, "nystromformer", "softmax (materialised)"),
                     _nystrom_memory(d, "skyformer"), _nystrom_memory(d, "nystromformer"),
                     mib(d["peak_memory_bytes"]["4096"]["softmax"]))),
    Quote("docs/nystrom.md", (NYSTROM,),
          "at L = 8192 they are {:.0f}× and {:.0f}× faster",
          lambda d: (_nystrom(d, "skyformer", length="8192"),
                     _nystrom(d, "nystromformer", length="8192"))),
    Quote("docs/nystrom.md", (SPECTRAL,),
          "(×{:.2f}–{:.2f} per doubling",
          lambda rows: (min(_doublings(rows)), max(_doublings(rows)))),
    Quote("docs/nystrom.md", (STABILITY,),
          "the per-seed means range from {:.2f} to {:.2f} (Gaussian) and {:.2f} to {:.2f} "
          "(Skyformer), and single steps swing between {:.2f} and {:.1f}",
          lambda d: (min(_per_seed(d, "gaussian")), max(_per_seed(d, "gaussian")),
                     min(_per_seed(d, "skyformer")), max(_per_seed(d, "skyformer")),
                     *(f(r["ratio"] for r in d["rows"]
                         if r["mechanism"] in ("gaussian", "skyformer")) for f in (min, max)))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "JSON beside it; {:.0f} s on the shared 2-core development machine",
          lambda d: (sum(d["wall_seconds"].values()),)),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "from the identity it is the exact inverse's ({:.4f}, what γ leaves), from the "
          "transposed starts {:.0f}–{:.0f} times that. With sampled landmarks the Nyström error "
          "itself ({:.3f} at L = 256, {:.3f} at 1024, the exact inverse's) dominates, and the "
          "transposed starts add {:.1f}–{:.0f}% of the output on top",
          lambda d: (_pinv(d, 64, "exact inverse")["vs_gaussian"],
                     *(f(_pinv(d, 64, i)["vs_gaussian"] / _pinv(d, 64, "identity")["vs_gaussian"]
                         for i in ("global", "per_matrix")) for f in (min, max)),
                     _pinv(d, 256, "exact inverse")["vs_gaussian"],
                     _pinv(d, 1024, "exact inverse")["vs_gaussian"],
                     *(f(100 * _pinv(d, n, i)["vs_exact_inverse"] for n in (256, 1024)
                         for i in ("global", "per_matrix")) for f in (min, max)))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "Its inverse error there ({}, {})",
          lambda d: (_exponent(_pinv(d, 256, "identity")["inverse"]),
                     _exponent(_pinv(d, 1024, "identity")["inverse"]))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "(median {:.4f} at L = 256)",
          lambda d: (_pinv(d, 256, "exact inverse")["median_smallest_eigenvalue"],)),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "the instability scores differ by {:.1f}%. The largest gradient norms come where the "
          "loss falls (identity at steps {} and {}, global at step {} of its second seed",
          lambda d: (100 * (max(s["tau_ratio_to_softmax"] for s in d["training"]["summary"]
                                .values())
                            / min(s["tau_ratio_to_softmax"] for s in d["training"]["summary"]
                                  .values()) - 1),
                     _largest_gradient_step(d, "identity", 0),
                     _largest_gradient_step(d, "identity", 1),
                     _largest_gradient_step(d, "global", 1))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "(20-step mean loss below {:g} after {} and {} steps)",
          lambda d: (d["config"]["learned_loss"],
                     *d["training"]["summary"]["identity"]["steps_to_learned_loss"])),
    # docs/simpletron.md
    Quote("docs/simpletron.md", (LEARNED,),
          "L=4096: {:.1f} ms against {:.1f} ms for PyTorch's fused softmax ({:.0f}×, per round "
          "{:.0f}–{:.0f}×",
          lambda d: (1000 * d["seconds"]["4096"]["simpletron"],
                     1000 * d["seconds"]["4096"]["softmax"], _learned(d, "simpletron"),
                     *(f(s / m for s, m in zip(d["round_seconds"]["4096"]["softmax"],
                                               d["round_seconds"]["4096"]["simpletron"],
                                               strict=True)) for f in (min, max)))),
    # docs/choosing-a-mechanism.md
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "nothing with 256 random features beats it below about {:,.0f} tokens",
          lambda d: (min(_crossover(d, n) for n in ("performer", "rfa", "gmm_prf")),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "faster than softmax from about 1K tokens ({:.2g}× at 4K, {:.2g}× at 16K) and causal "
          "with O(1) decoding, at {:.2g}× softmax's memory at 16K",
          lambda d: (_speed(d, "performer", 4096)["speedup"],
                     _speed(d, "performer", 16384)["speedup"],
                     _speed(d, "performer", 16384)["memory_ratio"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "({:.2f} with 256 features)",
          lambda d: (_error(d, "performer"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED, MECHANISMS),
          "({:.2f} against exact Gaussian-kernel attention), faster than softmax from about "
          "{:.1f}K tokens ({:.2g}× at 16K)",
          lambda s, e: (_error(e, "skyformer"), _crossover(s, "skyformer") / 1000,
                        _speed(s, "skyformer", 16384)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (SPEED, MECHANISMS),
          "{:.2f} error, {:.0f}× faster at 4K and {:.2g}× at 16K",
          lambda s, e: (_error(e, "nystromformer"), _speed(s, "nystromformer", 4096)["speedup"],
                        _speed(s, "nystromformer", 16384)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "(linear {:.2g}× at 4K, simpletron {:.2g}×)",
          lambda d: (_speed(d, "linear", 4096)["speedup"],
                     _speed(d, "simpletron", 4096)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "(relative error {:.1f}, untrained projections)",
          lambda d: (_error(d, "linformer"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "(faster from about {:.1f}–{:.1f}K); the RKS forms (cos and sin features; full "
          "covariances for `gmm_rks`) win later (≈ {:.1f}–{:.1f}K) and take {:.0f}× the memory "
          "of the PRF forms",
          lambda d: (
              min(_crossover(d, n) for n in ("gmm_prf", "fastfood_prf", "generative_prf")) / 1000,
              max(_crossover(d, n) for n in ("gmm_prf", "fastfood_prf", "generative_prf")) / 1000,
              min(_crossover(d, n) for n in ("gmm_rks", "fastfood_rks", "generative_rks")) / 1000,
              max(_crossover(d, n) for n in ("gmm_rks", "fastfood_rks", "generative_rks")) / 1000,
              _speed(d, "gmm_rks", 16384)["memory_ratio"]
              / _speed(d, "gmm_prf", 16384)["memory_ratio"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "({:.2f} against softmax of unit q, k)",
          lambda d: (_error(d, "nprf_rpe"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED_RPE,),
          "they run at about {:.2f}–{:.2f}× softmax's speed at 1K–16K on this CPU",
          lambda d: (min(r["speedup"] for r in d["rows"] if r["mechanism"] != "softmax"),
                     max(r["speedup"] for r in d["rows"] if r["mechanism"] != "softmax"))),
    Quote("docs/choosing-a-mechanism.md", (RPE_BLOCKED,),
          "the FFT of the paper is {:.0f}× slower still at 4K",
          lambda d: (_blocked(d, 256, 4096, "forward"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "the run of 2026-11-22, with the FFT, had {:.2f}× at 4K, {:.0f}× the memory and 16K "
          "skipped (a call predicted at {:.0f} s)",
          lambda d: (_speed(d, "nprf_rpe", 4096)["speedup"],
                     _speed(d, "nprf_rpe", 4096)["memory_ratio"],
                     float(_speed(d, "nprf_rpe", 16384)["status"].split()[2]))),
    Quote("docs/choosing-a-mechanism.md", (SPEED_RPE,),
          "with {:.1f}–{:.1f}× its memory",
          lambda d: (min(r["memory_ratio"] for r in d["rows"] if r["mechanism"] != "softmax"),
                     max(r["memory_ratio"] for r in d["rows"] if r["mechanism"] != "softmax"))),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# measurements with no committed result file yet, and numbers that are not measurements

DEMO = (
    "a `make demo` run's `runs/demo` (report.md, speed/, approx/, train/*/results.json) "
    "committed as benchmarks/results/demo/"
)
LISTOPS_RUNS = "the four runs' results.json and metrics.jsonl under benchmarks/results/listops/"
LM_RUNS = "the LM runs' results.json (and the sample) under benchmarks/results/lm-train/"

U, N = Unrecorded, NotMeasured
UNRECORDED: list[Unrecorded] = [
    U("README.md", "— 40.5% test accuracy in 3.5 minutes on a 2-core CPU (softmax: 42.2% in 2.3 "
      "minutes; the majority class is 15.7%)", False, LISTOPS_RUNS),
    U("README.md", "On the embedded corpus a 2-layer byte-level model reaches 2.51 (`softmax`, "
      "96 s), 2.93 (`performer`, M=64) and 2.66 (`nprf_rpe` with `rpe=\"decay\"`) test bits "
      "per byte after 1000 steps on a 2-core CPU, against 4.52 for the unigram baseline",
      False, LM_RUNS),
    U("README.md", "`make demo` took 9 min 15 s on the 2-core development machine", False,
      DEMO),
    U("README.md", "`make demo` took 9 min 15 s, set-up included, and printed the table below",
      False, DEMO),
    U("README.md", "| mechanism | rel. error vs exact | speed-up vs softmax at L=4,096 |",
      True, DEMO),
    U("docs/performance.md", "at about 160 GFLOP/s in isolation on this machine (a one-off "
      "measurement, not committed), so roughly 6 ms", False,
      "a script that times batched 64×64 matrix products, and its result file"),
    U("docs/choosing-a-mechanism.md", "reached 36–39% test accuracy (the README's demo table)",
      False, DEMO),
    U("docs/language-modelling.md", "231 files, 3.6 MB train / 200 KB valid / 200 KB test",
      False, LM_RUNS),
    U("docs/language-modelling.md", "0.46 M parameters); bits per byte of the best checkpoint "
      "on the whole test split. The **unigram baseline is 4.519 bits per byte**.", False,
      LM_RUNS),
    U("docs/language-modelling.md", "| mechanism | steps | test bits/byte |", True, LM_RUNS),
    U("docs/language-modelling.md", "`performer` (2.66 against 2.93 bits per byte after 1000 "
      "steps), at about a quarter of `softmax`'s tokens/s", False, LM_RUNS),
    U("docs/language-modelling.md", "A sample after 96 s of training", False, LM_RUNS),
    U("docs/reproducing-lra.md", "**15.7%**", False, LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "| task | preset | mechanism | steps | test accuracy |", True,
      LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "that run was 3.1× slower than softmax", False, LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "falls to 16–24% and recovers", False, LISTOPS_RUNS),
    U("docs/nystrom.md", "Skyformer forward + backward 18 ms at the scale above versus 130 ms at "
      "three times it. The exact inverse, `pinv_iterations=None` (an LU solve of the 128 × 128 "
      "system), took 11 ms and 25 ms in the same two cases", False,
      "a script that times skyformer at L = 4096 at one and three times the input scale, "
      "iterative and exact inverse, on the Intel Xeon, and its result file under "
      "benchmarks/results/"),
]  # fmt: skip

NOT_MEASURED: list[NotMeasured] = [
    N("docs/api.md", "dropout=0.0, attention_dropout=0.0, norm_first=True, embedding_std=0.02",
      False, "defaults"),
    N("docs/api.md", "N(0, 0.02²)", False, "an initialisation"),
    N("docs/choosing-a-mechanism.md", "q, k ~ N(0, 0.55²)", False, "inputs of the error study"),
    N("docs/feedforward-kernels.md", "| name | φ(x) |", True, "defaults"),
    N("docs/feedforward-kernels.md", "| option | maps | default | meaning |", True, "defaults"),
    N("docs/feedforward-kernels.md", "The thesis chose λ = 0.1", False, "the paper's setting"),
    N("docs/kernelized.md", "below 0.12 at M = 1024 (q, k ~ N(0, 0.25), D = 16, L = 128)", False,
      "a bound tests/test_kernelized.py checks, and its inputs"),
    N("docs/nystrom.md", "(the released code uses 0.1)", False, "a setting"),
    N("docs/nystrom.md", "1 MiB of rows at a time, at most 8 blocks", False, "settings"),
    N("docs/nystrom.md", "q, k and v (4 MiB at this size)", False,
      "counted: 4 × 4096 × 2 × 32 × 4 B"),
    N("docs/nystrom.md", "(L, 128) kernel matrices (4 MiB each)", False,
      "counted: 4096 × 128 × 2 heads × 4 B"),
    N("docs/nystrom.md", "128 × 128", False, "a shape"),
    N("docs/nystrom.md", "N(0, 0.554²)", False, "inputs of the studies"),
    N("docs/nystrom.md", "8 × 512 synthetic tokens", False, "a setting"),
    N("docs/nystrom.md", "N(0, 0.02²)", False, "an initialisation"),
    N("docs/nystrom.md", "grows by 3.25 a step", False, "arithmetic: the step's 13/4 on a zero "
      "eigenvalue"),
    N("docs/nystrom.md", "still more than 10% off after 6 steps", False,
      "a bound tests/test_gaussian_nystrom.py checks"),
    N("docs/learned-kernels.md", "4 × (Linear, BatchNorm, LeakyReLU)", False, "an architecture"),
    N("docs/learned-kernels.md", "64×64 matmul", False, "a shape"),
    N("docs/performance.md", "20× target", False, "a target"),
    N("docs/performance.md", "0.95 GFLOP", False, "counted, not measured"),
    N("docs/performance.md", "2 × 134 M", False, "counted"),
    N("docs/performance.md", "Batched 64×64 products", False, "a shape"),
    N("docs/language-modelling.md", "≥ 3×", False, "a target"),
    N("docs/language-modelling.md", "the first 4 MB", False, "a setting"),
    N("docs/reproducing-lra.md", "7.7 GB", False, "a download's size"),
    N("docs/reproducing-lra.md", "the last 10% of the training batches", False, "a split"),
    N("docs/reproducing-lra.md", "warms up for 30% of the run instead", False, "a setting"),
    N("docs/reproducing-lra.md", "| | `skyformer` | `lra` | `kl` | `small` |", True, "presets"),
    N("docs/reproducing-lra.md", "the standard error of an accuracy near 40% is 1.1 points", False,
      "arithmetic: √(0.4·0.6/2000)"),
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages from the files")
    args = parser.parse_args(argv)
    if args.write:
        for page in write():
            print(f"rewrote {page}")
    missing = sorted({entry.missing for entry in UNRECORDED})
    if missing:
        print(f"note: {len(UNRECORDED)} quoted passages have no committed result file yet; "
              "commit " + "; ".join(missing), file=sys.stderr)  # fmt: skip
    problems = check()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
