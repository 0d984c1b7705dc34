"""The markdown table of ``benchmarks/lm_speed.py``'s results (decoding, training, targets).

Imported by ``lm_speed.py``, which Python runs with this folder on its path.
"""

from __future__ import annotations

from kattn.bench.script_results import machine_line

#: the model whose attention returns ``v`` unchanged: the cost of everything but attention.
CEILING = "no attention (ceiling)"


def render(report: dict) -> str:
    info, cfg, load = report["machine"], report["config"], report["load_average"]
    lines = [
        "# Causal language model on the CPU: decoding and training throughput",
        "",
        machine_line(info),
        f"`CausalLM`: vocabulary {cfg['vocab_size']} (bytes), dim {cfg['dim']}, depth "
        f"{cfg['depth']}, {cfg['num_heads']} heads (head dim {cfg['dim'] // cfg['num_heads']}), "
        f"FFN {cfg['ffn_dim']}, sinusoidal positions, no dropout, fp32, "
        f"{cfg['parameters'] / 1e6:.2f} M parameters. Medians of interleaved rounds; load "
        f"average (1 min) {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end.",
        "",
        "## Decoding",
        "",
        f"One step = one new token for each of the B sequences, after a prompt of `context` "
        f"tokens read by `prefill`; median over {cfg['decode_rounds']} rounds of the median of "
        f"{cfg['decode_steps_per_round']} steps, `torch.inference_mode()`. State: the decoding "
        "state of all layers (the key/value cache filled up to the position, and as allocated).",
        "",
        "| B | context | mechanism | ms/step | tokens/s | state MiB | allocated MiB "
        "| softmax / mechanism | prefill s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    soft = {(r["batch"], r["context"]): r for r in report["decode"] if r["mechanism"] == "softmax"}
    for r in report["decode"]:
        ref = soft[r["batch"], r["context"]]
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['mechanism']} | {r['step_seconds'] * 1e3:.2f} "
            f"| {r['tokens_per_second']:.0f} | {r['state_bytes_filled'] / 2**20:.2f} "
            f"| {r['state_bytes_allocated'] / 2**20:.2f} "
            f"| {ref['step_seconds'] / r['step_seconds']:.2f}× | {r['prefill_seconds']:.2f} |"
        )
    lines += [
        "",
        "## Training",
        "",
        f"One AdamW step (lr 1e-4) over {cfg['train_tokens_per_step']} tokens: forward, "
        f"cross-entropy, backward, step; median over {cfg['train_rounds']} rounds after one "
        "warm-up step.",
        "",
        "| block | batch | mechanism | s/step | tokens/s | mechanism / softmax |",
        "|---|---|---|---|---|---|",
    ]
    soft = {r["block"]: r for r in report["train"] if r["mechanism"] == "softmax"}
    for r in report["train"]:
        ratio = soft[r["block"]]["step_seconds"] / r["step_seconds"]
        lines.append(
            f"| {r['block']} | {r['batch']} | {r['mechanism']} | {r['step_seconds']:.3f} "
            f"| {r['tokens_per_second']:.0f} | {ratio:.2f}× |"
        )
    lines += [
        "",
        f"The {CEILING} row runs everything but attention (its attention returns `v`); since "
        "that part of the step is shared by all models, its ratio bounds every mechanism's.",
        "",
        "## Targets",
        "",
        "| ratio | measured | per-round range | target | bound (ceiling / softmax) | met |",
        "|---|---|---|---|---|---|",
    ]
    for t in report["targets"]:
        goal = f"≥ {t['min']:g}×" if t["min"] is not None else f"≤ {t['max']:g}×"
        bound = f"{t['bound']:.2f}×" if t["bound"] is not None else "—"
        lines.append(
            f"| {t['name']} | {t['value']:.2f}× | {min(t['rounds']):.2f}–{max(t['rounds']):.2f}× "
            f"| {goal} | {bound} | {'yes' if t['met'] else 'NO'} |"
        )
    lines += [
        "",
        "Correctness checked first (max abs difference of `prefill` + `step` logits from the "
        "parallel forward, 24 + 8 tokens): "
        + ", ".join(f"{k} {v:.1e}" for k, v in report["correctness_max_abs_error"].items())
        + ".",
        "",
    ]
    return "\n".join(lines)
