"""Renderers of the fine-tuning part of docs/pretraining.md: runs of ``kattn train --task
finetune`` (from the pre-training runs) and ``--task text-classification`` (from scratch) on
the embedded gettext set, and the set's bag-of-bytes baselines."""

from __future__ import annotations

#: the runs: folder under benchmarks/results/finetuning/ → where the encoder starts (the
#: attention column is the run's own mechanism).
FINETUNING_LABELS = (
    ("finetune-softmax", "pre-trained (mlm run `softmax`)"),
    ("finetune-nprf_rpe", "pre-trained (mlm run `nprf_rpe`)"),
    ("finetune-softmax-lr1e-4", "pre-trained (mlm run `softmax`), peak rate 1e-4"),
    ("scratch-softmax", "from scratch"),
    ("scratch-nprf_rpe", "from scratch"),
)
FINETUNING_RUNS = tuple(
    f"benchmarks/results/finetuning/{name}/results.json" for name, _ in FINETUNING_LABELS
)
BAG_OF_BYTES = "benchmarks/results/finetuning/bag-of-bytes.json"


def _check_start(start: str, run: dict) -> None:
    """``AssertionError`` unless the run's ``results.json`` says what its label does: the
    pre-training run it starts from (or none) and any peak rate named."""
    init = run.get("init_from")
    if start.startswith("from scratch"):
        assert init is None, (start, init)
    else:
        mechanism = start.split("`")[1]
        assert init is not None and f"/pretraining/{mechanism}/" in init, (start, init)
    if "peak rate" in start:
        rate = float(start.rsplit("peak rate ", 1)[1])
        assert run["config"]["optim"]["lr"] == rate, (start, run["config"]["optim"]["lr"])


def finetuning_runs(*files: dict) -> str:
    """One row per run: test and best-valid accuracy, time and speed; then the baselines of
    the set (majority, naive Bayes over bytes and byte bigrams) and the set's description."""
    *runs, bag = files
    lines = [
        "| encoder | attention | test accuracy (%) | best valid accuracy (%) | best step "
        "| time | steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (_, start), run in zip(FINETUNING_LABELS, runs, strict=True):
        _check_start(start, run)
        label = _attention(run["mechanism"])
        lines.append(
            f"| {start} | {label} | {100 * run['test_metrics']['accuracy']:.1f} | "
            f"{100 * run['best_valid_accuracy']:.1f} | {run['best_step']:,} | "
            f"{run['wall_time_s']:,.0f} s | {run['steps_per_s']:.2f} |"
        )
    lines += [
        f"| majority class | — | {100 * bag['majority_accuracy']:.1f} | | | | |",
        f"| naive Bayes, bytes | — | {100 * bag['naive_bayes_bytes_accuracy']:.1f} | | | | |",
        f"| naive Bayes, byte bigrams | — | "
        f"{100 * bag['naive_bayes_byte_bigrams_accuracy']:.1f} | | | | |",
    ]
    first = runs[0]
    sizes, manifest = first["data"]["sizes"], first["data"]["embedded"]
    for run in runs:  # every run and the baselines read one set
        assert run["data"]["embedded"]["sha256"] == manifest["sha256"], run["mechanism"]
    assert bag["sha256"] == manifest["sha256"], "bag-of-bytes.json"
    parameters = {run["mechanism"]: run["num_parameters"] for run in runs}
    m = first["config"]["model"]
    lines += [
        "",
        f"{sizes['train']:,} / {sizes['valid']:,} / {sizes['test']:,} examples (train / "
        f"valid / test) of {len(manifest['classes'])} classes ({', '.join(manifest['classes'])}), "
        f"train.csv SHA-256 `{manifest['sha256']['train.csv'][:16]}…`; {m['num_layers']} "
        f"layers, width {m['dim']}, {m['num_heads']} heads, FFN {m['ffn_dim']}, "
        + ", ".join(f"{n:,} parameters with {name}" for name, n in parameters.items())
        + f"; {first['steps']:,} steps of "
        f"{first['config']['train']['batch_size']} examples.",
    ]
    return "\n".join(lines)


def _attention(mechanism: str) -> str:
    """A mechanism as the page names it: softmax plain, the others as code."""
    return mechanism if mechanism == "softmax" else f"`{mechanism}`"
