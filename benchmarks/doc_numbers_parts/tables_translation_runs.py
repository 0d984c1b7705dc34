"""Renderer of the translation runs' table in docs/translation.md: the layout of Luo et al.
2021's Table 3 (encoder and decoder mechanism × BLEU) for the runs of ``kattn train --task
translation`` on the embedded corpus."""

from __future__ import annotations

#: the runs of the table: folder name under benchmarks/results/translation/, then how the
#: page names its encoder, decoder (self- and cross-attention) and the options that differ.
TRANSLATION_RUNS = (
    ("softmax", "softmax", "softmax", ""),
    ("performer-decoder", "softmax", "`performer`", "M = 24"),
    ("performer", "`performer`", "`performer`", "M = 16 / 24"),
    ("nprf_rpe", "`nprf_rpe`", "`nprf_rpe`", "M = 16 / 24; cross-attention without RPE"),
)


def _mechanisms(run: dict) -> tuple[str, str, str]:
    plan = run["attention_plan"]
    return plan["encoder_attention"], plan["decoder_attention"], plan["cross_attention"]


def translation_runs(*runs: dict) -> str:
    """One row per run (its results.json): BLEU on test and valid, the copy-the-source
    floor, test loss and wall time."""
    lines = [
        "| encoder | decoder | options | test BLEU | valid BLEU | copying the source (test) "
        "| test loss (nats/token) | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, encoder, decoder, options), run in zip(TRANSLATION_RUNS, runs, strict=True):
        enc, dec, _ = _mechanisms(run)
        assert encoder.strip("`") == enc and decoder.strip("`") == dec, (name, enc, dec)
        lines.append(
            f"| {encoder} | {decoder} | {options} | {run['test_bleu']:.1f} | "
            f"{run['valid_bleu']:.1f} | {run['copy_source_test_bleu']:.1f} | "
            f"{run['test_loss']:.3f} | {run['wall_time_s']:,.0f} s |"
        )
    first = runs[0]
    data, decoding = first["data"], first["bleu"]["decoding"]
    pairs = data["pairs"]
    lines += [
        "",
        f"{data['src']}→{data['tgt']}, {pairs['train']:,} / {pairs['valid']:,} / "
        f"{pairs['test']:,} pairs, joint BPE of {data['vocab_size']:,}; "
        f"{first['steps']:,} steps each; beam {decoding['beam_size']}, length penalty "
        f"{decoding['length_penalty']:g}; BLEU by sacrebleu "
        f"(`{first['bleu']['test']['model']['signature']}`).",
    ]
    return "\n".join(lines)


def study_tables(study: dict) -> str:
    """A ``kattn study`` result (its study.json) as ``study.md`` shows it, without the title,
    the metrics' headings in bold."""
    from kattn.train.study_report import markdown

    lines = markdown(study).strip("\n").split("\n")[2:]  # the title and its blank line
    return "\n".join(f"**{line[3:]}**" if line.startswith("## ") else line for line in lines)
