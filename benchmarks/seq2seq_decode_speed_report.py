"""The summaries and the markdown page of ``benchmarks/seq2seq_decode_speed.py``.

Imported by that script, which Python runs with this folder on its path.
"""

from __future__ import annotations

import statistics
from typing import Any

from kattn.bench.timing import tensor_bytes
from kattn.functional.softmax import KVCache

SOFTMAX = "softmax"
#: the timed quantities of one run, per token or per source
TIMES = ("encode_seconds", "cross_cache_seconds", "first_seconds", "last_seconds", "all_seconds")
SIZES = ("state_bytes", "state_bytes_allocated", "self_state_bytes", "cross_cache_bytes")


def _filled_bytes(layer_state: Any) -> int:
    """Bytes of a self-attention state, a key/value cache counted up to its length only (its
    buffers have spare capacity)."""
    if isinstance(layer_state, KVCache):
        used = (layer_state.keys[:, :, : layer_state.length],
                layer_state.values[:, :, : layer_state.length])  # fmt: skip
        return tensor_bytes(used)
    return tensor_bytes(layer_state)


def state_bytes(state: Any) -> dict[str, int]:
    """Sizes of a ``Seq2SeqState``: the decoder's self-attention states (filled), the cross
    caches, their sum (``state_bytes``) and the sum as allocated."""
    own = sum(_filled_bytes(x) for x in state.layers)
    cross = tensor_bytes(state.cross)
    extra = tensor_bytes(state.tokens)  # None for mechanisms with a recurrent form
    return {
        "state_bytes": own + cross + extra,
        "state_bytes_allocated": tensor_bytes(state.layers) + cross + extra,
        "self_state_bytes": own,
        "cross_cache_bytes": cross,
    }


def _rows(runs: list[dict], length: int, config: str) -> list[dict]:
    return [r for r in runs if r["length"] == length and r["config"] == config]


def summarise(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per length and configuration, the median over rounds of every time and size."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for length in sorted({r["length"] for r in runs}):
        out[str(length)] = {}
        for config in dict.fromkeys(r["config"] for r in runs):
            rows = _rows(runs, length, config)
            out[str(length)][config] = {
                key: statistics.median(r[key] for r in rows) for key in (*TIMES, *SIZES)
            }
    return out


def ratios(runs: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per length and timed quantity (and the state's size), softmax's over the other
    configuration's: the ratio of the medians and the per-round ratios."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    configs = list(dict.fromkeys(r["config"] for r in runs))
    other = next(c for c in configs if c != SOFTMAX)
    for length in sorted({r["length"] for r in runs}):
        soft, kern = _rows(runs, length, SOFTMAX), _rows(runs, length, other)
        soft.sort(key=lambda r: r["round"])
        kern.sort(key=lambda r: r["round"])
        found = {}
        for key in (*TIMES, "state_bytes"):
            per_round = [a[key] / b[key] for a, b in zip(soft, kern, strict=True)]
            median = statistics.median(a[key] for a in soft) / statistics.median(
                b[key] for b in kern
            )
            found[key] = {"value": median, "rounds": per_round}
        out[str(length)] = found
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f}"


def render(report: dict) -> str:
    info, cfg, load = report["machine"], report["config"], report["load_average"]
    summary, found = report["summary"], report["ratios"]
    w = cfg["window"]
    lines = [
        "# Encoder–decoder decoding on the CPU: softmax with caches against kernelized attention",
        "",
        f"{info['processor']}, {info['torch_threads']} torch thread(s) "
        f"(OMP_NUM_THREADS={report['environment']['OMP_NUM_THREADS']}); torch {info['torch']}, "
        f"kattn {info['kattn']}, Python {info['python']}. Load average (1 min) "
        f"{load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end; "
        f"{report['wall_seconds']:.0f} s in all.",
        f"`Seq2Seq`: {cfg['num_encoder_layers']} + {cfg['num_decoder_layers']} layers, dim "
        f"{cfg['dim']}, {cfg['num_heads']} heads, FFN {cfg['ffn_dim']}, vocabulary "
        f"{cfg['vocab_size']} (shared), sinusoidal positions, fp32, batch {cfg['batch']}, "
        f"{cfg['parameters'] / 1e6:.1f} M parameters (softmax). Command: `{report['command']}`.",
        "",
        "Source and target both L tokens. Encode: `encode` of the source; cross cache: "
        "`init_decoding`; then L `decode_step` calls, each timed: ms per token, mean over the "
        f"first {w} steps, the last {w} and all. State: bytes of the `Seq2SeqState` after the "
        "last step (self-attention states, the key/value caches filled up to the position, "
        "plus the cross caches). Medians over "
        f"{cfg['rounds']} interleaved rounds.",
        "",
        f"| L | configuration | encode s | cross cache ms | ms/token, first {w} "
        f"| ms/token, last {w} | ms/token, all | state MiB | of which cross MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for length, rows in summary.items():
        for config, r in rows.items():
            lines.append(
                f"| {length} | {config} | {r['encode_seconds']:.2f} "
                f"| {_ms(r['cross_cache_seconds'])} | {_ms(r['first_seconds'])} "
                f"| {_ms(r['last_seconds'])} | {_ms(r['all_seconds'])} "
                f"| {_mib(r['state_bytes'])} | {_mib(r['cross_cache_bytes'])} |"
            )
        ratio = found[length]
        cells = " | ".join(
            f"{ratio[k]['value']:.2f}× ({min(ratio[k]['rounds']):.2f}–"
            f"{max(ratio[k]['rounds']):.2f})"
            for k in TIMES
        )
        lines.append(f"| {length} | softmax / other | {cells} "
                     f"| {ratio['state_bytes']['value']:.1f}× | |")  # fmt: skip
    lines += [
        "",
        "softmax / other: softmax's median over the other configuration's (per-round range).",
        "",
        "## Which relative encodings decode in O(1) per token",
        "",
        "One `nprf_rpe` attention (B=1, 4 heads, M = 24) per encoding with a recurrent form, "
        "read to each position with `prefill`; median time of "
        f"{cfg['probe_steps']} `step` calls there and the state's size after them.",
        "",
        "| rpe | position | µs/step | state KiB |",
        "|---|---|---|---|",
    ]
    for r in report["rpe_probe"]:
        lines.append(f"| `{r['rpe']}` | {r['position']} | {r['step_seconds'] * 1e6:.0f} "
                     f"| {r['state_bytes'] / 2**10:.1f} |")  # fmt: skip
    checks = ", ".join(f"{k} {v:.1e}" for k, v in report["correctness_max_abs_error"].items())
    lines += ["", "Checked first: max abs difference of `decode_step` logits from the "
              f"teacher-forced forward ({report['correctness_length']} tokens): {checks}.",
              ""]  # fmt: skip
    return "\n".join(lines)
