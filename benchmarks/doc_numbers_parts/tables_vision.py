"""Renderers of the generated parts of docs/vision.md: the image runs of ``kattn train`` on
the embedded shapes (classification as Luo et al. 2021's Table 4 compares them, generation as
its Table 6 scores them) and the ViT-block speed of ``benchmarks/vit_speed.py``."""

from __future__ import annotations

from .sources import mib

#: the classification runs: folder under benchmarks/results/vision/ → how the page names it.
VISION_CLS_RUNS = (
    ("cls-softmax", "softmax (DeiT's attention)"),
    ("cls-nprf", "`nprf_rpe` without RPE (`rpe=None`)"),
    ("cls-nprf_rpe", "`nprf_rpe` with 2-D RPE (`toeplitz2d`)"),
)
#: the generation runs.
VISION_GEN_RUNS = (
    ("gen-softmax", "softmax"),
    ("gen-nprf_rpe", "`nprf_rpe` with 2-D RPE (`toeplitz2d`)"),
)


def _rpe(run: dict) -> object:
    return run["attention_options"].get("rpe")


def vision_classification(*runs: dict) -> str:
    """One row per run (its results.json): top-1 and top-5 on test, best valid, time."""
    lines = [
        "| attention | test top-1 | test top-5 | best valid top-1 | parameters | time |",
        "|---|---|---|---|---|---|",
    ]
    for (_, label), run in zip(VISION_CLS_RUNS, runs, strict=True):
        lines.append(
            f"| {label} | {100 * run['test_accuracy']:.1f}% | "
            f"{100 * run['test_top5_accuracy']:.1f}% | {100 * run['best_valid_accuracy']:.1f}% | "
            f"{run['num_parameters']:,} | {run['wall_time_s']:,.0f} s |"
        )
    assert _rpe(runs[1]) is None and _rpe(runs[2]) == "toeplitz2d", "runs out of order"
    first, data = runs[0], runs[0]["data"]
    m = first["config"]["model"]
    lines += [
        "",
        f"{data['sizes']['train']:,} / {data['sizes']['valid']:,} / {data['sizes']['test']:,} "
        f"images of {data['num_classes']} classes (majority baseline "
        f"{100 * first['majority_baseline']:.0f}%); a {m['num_layers']}-layer ViT of width "
        f"{m['dim']}, {m['num_heads']} heads, {m['patch_size']}×{m['patch_size']} patches; "
        f"{first['steps']:,} steps of batch {first['config']['train']['batch_size']} each.",
    ]
    return "\n".join(lines)


def vision_generation(*runs: dict) -> str:
    """One row per run: test bits/dim against the uniform and histogram baselines."""
    hist = runs[0]["histogram_bits_per_dim"]
    lines = [
        "| model | test bits/dim | best valid bits/dim | time |",
        "|---|---|---|---|",
        f"| uniform over 256 values | {runs[0]['uniform_bits_per_dim']:.3f} | | |",
        f"| one histogram of all sub-pixels (train) | {hist['marginal']:.3f} | | |",
        f"| one histogram per sub-pixel position (train) | {hist['per_position']:.3f} | | |",
    ]
    for (_, label), run in zip(VISION_GEN_RUNS, runs, strict=True):
        lines.append(
            f"| {label} | {run['test_bits_per_dim']:.3f} | "
            f"{run['best_valid_bits_per_dim']:.3f} | {run['wall_time_s']:,.0f} s |"
        )
    first = runs[0]
    m, size = first["config"]["model"], first["config"]["data"]["image_size"]
    lines += [
        "",
        f"The embedded shapes at {size}×{size} RGB: {3 * size * size:,} sub-pixels per image; "
        f"a {m['num_layers']}-layer decoder of width {m['dim']}, {m['num_heads']} heads; "
        f"{first['steps']:,} steps of batch {first['config']['train']['batch_size']}.",
    ]
    return "\n".join(lines)


def _ratio(r: dict) -> str:
    return f"{r['value']:.2f}× ({min(r['rounds']):.2f}–{max(r['rounds']):.2f})"


def vit_speed(d: dict) -> str:
    """Per image size: forward+backward time and peak memory of one block, softmax against
    ``nprf_rpe`` (its ``auto`` path) and ``nprf_rpe`` on the 2-D FFT."""
    cfg = d["config"]
    lines = [
        f"One block (dim {cfg['dim']}, {cfg['heads']} heads, FFN {cfg['ffn_dim']}), batch "
        f"{cfg['batch']}, fp32, {d['machine']['torch_threads']} torch threads, forward + "
        "backward; medians of interleaved rounds (softmax over the other: the ratio, its "
        "per-round range in brackets; above 1, the other is faster).",
        "",
        "| image | patch | L | softmax (ms) | `nprf_rpe` auto (ms) | ratio | `auto` path "
        "| `nprf_rpe` FFT (ms) | ratio | peak MiB: softmax / auto / FFT |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in d["rows"]:
        t, mem = row["seconds"], row["memory_bytes"]
        peaks = " / ".join(f"{mib(mem[k]):,.0f}" for k in ("softmax", "nprf_rpe", "nprf_rpe fft"))
        lines.append(
            f"| {row['image']}² | {row['patch']} | {row['length']:,} | "
            f"{1e3 * t['softmax']:,.0f} | {1e3 * t['nprf_rpe']:,.0f} | "
            f"{_ratio(row['time_ratio'])} | {row['kernelized_path']} | "
            f"{1e3 * t['nprf_rpe fft']:,.0f} | {_ratio(row['fft_time_ratio'])} | {peaks} |"
        )
    return "\n".join(lines)
