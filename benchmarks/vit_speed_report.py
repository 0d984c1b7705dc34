"""Pure parts of ``benchmarks/vit_speed.py``: the sizes, the softmax / ``nprf_rpe`` ratios and
the markdown table of a result.

Imported by ``vit_speed.py``, which Python runs with this folder on its path.
"""

from __future__ import annotations

import statistics

SOFTMAX, KERNELIZED, FFT = "softmax", "nprf_rpe", "nprf_rpe fft"
#: the configurations timed, in the order of the table.
CONFIGS = (SOFTMAX, KERNELIZED, FFT)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"64x4,224x4"`` → ``[(64, 4), (224, 4)]``: (image side, patch side) pairs, the patch
    dividing the image."""
    sizes = []
    for item in text.split(","):
        image, _, patch = item.strip().partition("x")
        if not (image.isdigit() and patch.isdigit()) or int(patch) < 1 or int(image) < 1:
            raise ValueError(f"sizes must be IMAGExPATCH pairs such as 64x4, got {item!r}")
        if int(image) % int(patch):
            raise ValueError(f"size {item}: the patch side must divide the image side")
        sizes.append((int(image), int(patch)))
    return sizes


def ratio_summary(
    round_seconds: dict[str, list[float]], name: str = KERNELIZED
) -> dict[str, object]:
    """softmax's time over configuration ``name``'s (above 1: ``name`` is faster): the ratio
    of the two medians over rounds, and the ratio within each round (its spread shows the
    noise)."""
    soft, kern = round_seconds[SOFTMAX], round_seconds[name]
    rounds = [s / k for s, k in zip(soft, kern, strict=True)]
    return {"value": statistics.median(soft) / statistics.median(kern), "rounds": rounds}


def _ratio(ratio: dict | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio['value']:.2f}× ({min(ratio['rounds']):.2f}–{max(ratio['rounds']):.2f})"


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f}"


def render(report: dict) -> str:
    """The markdown table of a ``vit_speed.py`` result."""
    info, config = report["machine"], report["config"]
    threads = info["torch_threads"]
    lines = [
        "# One ViT block: `nprf_rpe` with the 2-D relative encoding against softmax",
        "",
        f"{info['processor']}, {threads} thread{'s' * (threads != 1)}; torch {info['torch']}, "
        f"kattn {info['kattn']}. One pre-LN `kattn.nn.EncoderLayer` at DeiT-small width (dim "
        f"{config['dim']}, {config['heads']} heads, FFN {config['ffn_dim']}), batch "
        f"{config['batch']}, {config['dtype']}, forward + backward (training mode, no "
        f"dropout); medians of interleaved rounds ({config['rounds']}). Command: "
        f"`{report['command']}`.",
        "",
        "| image | patch | grid | L | softmax (ms) | nprf_rpe (ms) | softmax / nprf_rpe time "
        "(rounds) | nprf_rpe fft (ms) | softmax / fft time (rounds) | softmax peak (MiB) "
        "| nprf_rpe peak (MiB) | fft peak (MiB) | softmax / nprf_rpe memory | nprf_rpe path |",
        "|---:|---:|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in report["rows"]:
        s, mem = row["seconds"], row["memory_bytes"]
        fft = f"{s[FFT] * 1e3:,.1f}" if FFT in s else "—"
        lines.append(
            f"| {row['image']} | {row['patch']} | {row['grid'][0]}×{row['grid'][1]} | "
            f"{row['length']} | {s[SOFTMAX] * 1e3:,.1f} | {s[KERNELIZED] * 1e3:,.1f} | "
            f"{_ratio(row['time_ratio'])} | {fft} | {_ratio(row['fft_time_ratio'])} | "
            f"{_mib(mem[SOFTMAX])} | {_mib(mem[KERNELIZED])} | {_mib(mem.get(FFT))} | "
            f"{row['memory_ratio']:.2f}× | {row['kernelized_path']} |"
        )
    lines += ["", "## Notes", ""]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"
