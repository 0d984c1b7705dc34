"""Renderer of the generated part of docs/translation.md: the decoding speed of the
encoder–decoder Transformer, softmax with caches against kernelized attention
(``benchmarks/seq2seq_decode_speed.py``)."""

from __future__ import annotations

from .sources import mib, ratio_cell

#: how the page names the two configurations of the run
CONFIG_LABELS = {
    "softmax": "softmax (key/value cache)",
    "nprf_rpe": "`nprf_rpe`, decoder `decay`",
}


def translation_decode(d: dict) -> str:
    """Per length: encoding time, time per generated token at the start, the end and over all
    steps, and the decoding state's size, for both configurations and as softmax's over
    ``nprf_rpe``'s; then which relative encodings keep a constant-size state."""
    cfg, w = d["config"], d["config"]["window"]
    threads = d["machine"]["torch_threads"]
    lines = [
        f"Batch 1, fp32, {threads} torch thread{'s' if threads != 1 else ''}; source and target "
        f"both L tokens; medians of {cfg['rounds']} interleaved rounds (softmax / `nprf_rpe`: "
        "the ratio of the medians, per-round range in brackets).",
        "",
        f"| L | configuration | encode (s) | ms/token, first {w} | ms/token, last {w} "
        "| ms/token, all | decoding state (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for length, rows in d["summary"].items():
        n = f"{int(length):,}"
        for config, r in rows.items():
            lines.append(
                f"| {n} | {CONFIG_LABELS.get(config, config)} | {r['encode_seconds']:.2f} "
                f"| {1e3 * r['first_seconds']:.2f} | {1e3 * r['last_seconds']:.2f} "
                f"| {1e3 * r['all_seconds']:.2f} | {mib(r['state_bytes']):.2f} |"
            )
        ratio = d["ratios"][length]
        cells = " | ".join(
            ratio_cell(ratio[k])
            for k in ("encode_seconds", "first_seconds", "last_seconds", "all_seconds")
        )
        lines.append(f"| {n} | softmax / `nprf_rpe` | {cells} "
                     f"| {ratio['state_bytes']['value']:.1f}× |")  # fmt: skip
    first, second = cfg["probe_positions"]
    probe = {(r["rpe"], r["position"]): r for r in d["rpe_probe"]}
    names = sorted({r["rpe"] for r in d["rpe_probe"]})
    lines += [
        "",
        f"Decoding state of one `nprf_rpe` attention (4 heads, M = 24) at positions {first} and "
        f"{second}, by encoding (median of {cfg['probe_steps']} steps at each):",
        "",
        f"| `rpe` | state at {first} (KiB) | at {second} (KiB) | µs/step at {first} "
        f"| at {second} | constant size |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        a, b = probe[name, first], probe[name, second]
        same = "yes" if a["state_bytes"] == b["state_bytes"] else "no"
        lines.append(
            f"| `{name}` | {a['state_bytes'] / 2**10:,.1f} | {b['state_bytes'] / 2**10:,.1f} "
            f"| {1e6 * a['step_seconds']:,.0f} | {1e6 * b['step_seconds']:,.0f} | {same} |"
        )
    return "\n".join(lines)
