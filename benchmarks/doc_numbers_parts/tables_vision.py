"""Renderers of the generated parts of docs/vision.md: the image runs of ``kattn train`` on
the embedded shapes (classification as Luo et al. 2021's Table 4 compares them, generation as
its Table 6 scores them) and the ViT-block speed of ``benchmarks/vit_speed.py``."""

from __future__ import annotations

from .sources import mib, ratio_cell

#: the classification runs: how the page names each configuration, and its run folders under
#: benchmarks/results/vision/ (one per seed: 42, the default, then 1 and 2).
VISION_CLS_CONFIGS = (
    ("softmax (DeiT's attention)", "cls-softmax"),
    ("`nprf_rpe` without RPE (`rpe=None`)", "cls-nprf"),
    ("`nprf_rpe` with 2-D RPE (`toeplitz2d`)", "cls-nprf_rpe"),
)
CLS_SEEDS = ("", "-seed1", "-seed2")
#: the generation runs: folder → how the page names it.
VISION_GEN_LABELS = (
    ("gen-softmax", "softmax"),
    ("gen-nprf_rpe", "`nprf_rpe` with 2-D RPE (`toeplitz2d`)"),
)


def _rpe(run: dict) -> object:
    return run["attention_options"].get("rpe")


def _mean_sd(values: list[float]) -> str:
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)) ** 0.5
    return f"{100 * mean:.1f} ± {100 * sd:.1f}"


def vision_classification(*runs: dict) -> str:
    """One row per configuration (its seeds' results.json): test top-1 as mean ± standard
    deviation over the seeds and each seed's, top-5, best valid top-1, time."""
    lines = [
        "| attention | test top-1 (%) | per seed | test top-5 (%) | best valid top-1 (%) "
        "| time per run |",
        "|---|---|---|---|---|---|",
    ]
    n = len(CLS_SEEDS)
    for i, (label, _) in enumerate(VISION_CLS_CONFIGS):
        group = runs[i * n : (i + 1) * n]
        assert (
            len({_rpe(r) for r in group}) == 1
            and len({r["config"]["train"]["seed"] for r in group}) == n
        )
        top1 = [r["test_accuracy"] for r in group]
        lines.append(
            f"| {label} | {_mean_sd(top1)} | {', '.join(f'{100 * v:.1f}' for v in top1)} | "
            f"{_mean_sd([r['test_top5_accuracy'] for r in group])} | "
            f"{_mean_sd([r['best_valid_accuracy'] for r in group])} | "
            f"{sum(r['wall_time_s'] for r in group) / n:,.0f} s |"
        )
    assert _rpe(runs[n]) is None and _rpe(runs[2 * n]) == "toeplitz2d", "runs out of order"
    first, data = runs[0], runs[0]["data"]
    m = first["config"]["model"]
    lines += [
        "",
        f"{data['sizes']['train']:,} / {data['sizes']['valid']:,} / {data['sizes']['test']:,} "
        f"images of {len(data['classes'])} classes (majority baseline "
        f"{100 * first['majority_baseline']:.0f}%); a {m['num_layers']}-layer ViT of width "
        f"{m['dim']}, {m['num_heads']} heads, {m['patch_size']}×{m['patch_size']} patches; "
        f"{first['steps']:,} steps of batch {first['config']['train']['batch_size']}; seeds "
        f"{', '.join(str(r['config']['train']['seed']) for r in runs[:n])}.",
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
    for (_, label), run in zip(VISION_GEN_LABELS, runs, strict=True):
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
        peaks = " / ".join(
            f"{mib(mem[k]):,.0f}" if k in mem else "—"
            for k in ("softmax", "nprf_rpe", "nprf_rpe fft")
        )
        fft = f"{1e3 * t['nprf_rpe fft']:,.0f}" if "nprf_rpe fft" in t else "not timed"
        lines.append(
            f"| {row['image']}² | {row['patch']} | {row['length']:,} | "
            f"{1e3 * t['softmax']:,.0f} | {1e3 * t['nprf_rpe']:,.0f} | "
            f"{ratio_cell(row['time_ratio'])} | {row['kernelized_path']} | {fft} | "
            f"{ratio_cell(row['fft_time_ratio'])} | {peaks} |"
        )
    return "\n".join(lines)
