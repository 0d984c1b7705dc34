"""Renderers of the generated parts of docs/pretraining.md: the masked-language-model runs of
``kattn train --task mlm`` on the embedded corpus (their results and loss curves)."""

from __future__ import annotations

#: the runs: folder under benchmarks/results/pretraining/ → how the page names the attention.
PRETRAINING_LABELS = (
    ("softmax", "softmax"),
    ("nprf_rpe", "`nprf_rpe` (`toeplitz` RPE)"),
)
PRETRAINING_RUNS = tuple(
    f"benchmarks/results/pretraining/{name}/results.json" for name, _ in PRETRAINING_LABELS
)


def _options(run: dict) -> str:
    options = run["attention_options"]
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items())) or "—"


def pretraining_runs(*runs: dict) -> str:
    """One row per run (its results.json): masked loss and accuracy on test (fixed masks) and
    best valid, the unigram baseline, time and throughput; then the data and model line."""
    lines = [
        "| attention | options | test masked loss (nats) | test masked accuracy (%) "
        "| best valid loss | unigram baseline loss | unigram accuracy (%) | time | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, label), run in zip(PRETRAINING_LABELS, runs, strict=True):
        assert run["mechanism"] == name, (name, run["mechanism"])
        lines.append(
            f"| {label} | {_options(run)} | {run['test_loss']:.3f} | "
            f"{100 * run['test_accuracy']:.1f} | {run['best_valid_loss']:.3f} | "
            f"{run['unigram_loss']:.3f} | {100 * run['unigram_accuracy']:.1f} | "
            f"{run['wall_time_s']:,.0f} s | {run['tokens_per_s']:,.0f} |"
        )
    first = runs[0]
    m, corpus, seqs = first["config"]["model"], first["corpus"], first["sequences"]
    lines += [
        "",
        f"{seqs['train']:,} / {seqs['valid']:,} / {seqs['test']:,} sequences of "
        f"{first['max_len']} bytes (train / valid / test; Python {corpus['python_version']}'s "
        f"standard library, SHA-256 `{corpus['sha256'][:16]}…`); {m['num_layers']} layers, "
        f"width {m['dim']}, {m['num_heads']} heads, FFN {m['ffn_dim']} ("
        + ", ".join(
            f"{label} {r['num_parameters']:,}"
            for (_, label), r in zip(PRETRAINING_LABELS, runs, strict=True)
        )
        + f" parameters); {first['steps']:,} steps of "
        f"{first['config']['train']['batch_size']} sequences; "
        f"{first['test_masked_tokens']:,} masked test tokens.",
    ]
    return "\n".join(lines)


def pretraining_curves(*runs: dict) -> str:
    """The validation masked loss of each run at every evaluation (the curve of its
    results.json, also in the run's mlm_curve.csv)."""
    curves = [{step: loss for step, loss, _ in run["curve"]["valid"]} for run in runs]
    steps = sorted(set().union(*curves))
    header = " | ".join(label for _, label in PRETRAINING_LABELS)
    lines = [f"| step | {header} |", "|---|" + "---|" * len(runs)]
    for step in steps:
        cells = " | ".join(f"{c[step]:.3f}" if step in c else "—" for c in curves)
        lines.append(f"| {step:,} | {cells} |")
    return "\n".join(lines)
