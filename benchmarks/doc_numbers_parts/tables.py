"""Renderers of the generated tables of README.md and docs/ (but docs/nystrom.md's, in
``tables_nystrom``): each takes the parsed result files and returns the markdown table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .sources import mib


def times_table(d: dict, keys: Sequence[tuple[str, str]]) -> str:
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
    return sig3(1000 * seconds)


def sig3(value: float) -> str:
    """Three significant digits (trailing zeros kept), no exponent."""
    return f"{value:,.0f}" if value >= 100 else f"{value:#.3g}"


def rpe_paths(d: dict) -> str:
    ms = {k: 1000 * v for k, v in d["seconds"].items()}
    ratio, rounds = d["ratios"], d["round_ratios"]

    def measured(key: str, word: str = "") -> str:
        return f"**{ratio[key]:.3g}×**{word} ({min(rounds[key]):.1f}–{max(rounds[key]):.1f}×)"

    def row(label: str, key: str, note: str = "") -> str:
        plain, causal = sig3(ms[f"{key} non-causal"]), sig3(ms[f"{key} causal"])
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
            cells.append(f"{sig3(ms)} ms, {_size(size)} MiB")
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


def demo_summary(report: str) -> str:
    """The summary table of a ``kattn demo`` report (the first table under ``## Summary``)."""
    section = report.split("## Summary", 1)[1]
    lines = section.strip("\n").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])
