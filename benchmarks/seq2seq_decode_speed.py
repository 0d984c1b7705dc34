"""Decoding speed of the encoder–decoder Transformer (``kattn.nn.Seq2Seq``) on the CPU:
softmax with a key/value cache against kernelized attention with a relative encoding
(Luo et al. 2021, §4.3, machine translation).

One model shape, Luo et al.'s for IWSLT'14 (§4.3): 6 encoder and 6 decoder layers, dim 512,
4 heads, FFN 1024, sinusoidal positions, a joint vocabulary of 10,000 tokens, random init
(``torch.manual_seed(0)``), eval mode, no dropout, fp32, batch 1. Two configurations:

* ``softmax``: softmax in all three attentions; the decoder's self-attention decodes with its
  growing key/value cache, the cross-attention with the source's keys and values, projected
  once per source;
* ``nprf_rpe``: the encoder's ``nprf_rpe`` (Toeplitz encoding, M = 16); the decoder's
  self-attention ``nprf_rpe`` with ``rpe="decay"`` and M = 24, whose decoding state has a
  constant size; the cross-attention ``kernelized`` with ``feature_map="prf"``,
  ``normalize_qk=True``, M = 24 and no relative encoding (``Seq2Seq.init_decoding`` refuses one
  there), whose cache is the source's kernelized sums ``Σ_j φ(k_j) v_jᵀ`` and ``Σ_j φ(k_j)``,
  computed once per source.

For each length L (source and target both L tokens, seeded random ids): ``encode`` is timed,
then ``init_decoding`` (the cross caches), then L calls of ``decode_step``, one target token
each (fixed ids, no end-of-sentence stop), each timed alone; the time per token is the mean
over the first ``--window`` steps, the last ``--window`` and all steps. The size of the
decoding state after the last step is the sum of its tensors' bytes (a key/value cache both
filled and as allocated). Configurations alternate within each round (their order reversed
every other round); the medians over rounds are reported, with the softmax / ``nprf_rpe``
ratios and their per-round range. Step-by-step logits are checked against the teacher-forced
forward first.

Then a probe of which relative encodings decode in O(1) per token: one ``nprf_rpe`` attention
with each encoding that has a recurrent form, its state and time per step at two positions.

Results go to ``benchmarks/results/seq2seq-decode-<machine>-torch<version>-kattn<version>
.{json,md}``.

    OMP_NUM_THREADS=1 python benchmarks/seq2seq_decode_speed.py    # the committed run
    python benchmarks/seq2seq_decode_speed.py --quick               # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import kattn
from kattn.bench import machine_info
from kattn.bench.script_results import write_run
from kattn.nn import Seq2Seq, Seq2SeqState
from seq2seq_decode_speed_report import (
    SOFTMAX,
    ratios,
    render,
    state_bytes,
    summarise,
    tensor_bytes,
)

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB, QUICK_VOCAB = 10_000, 300
SHAPE = {"dim": 512, "num_heads": 4, "ffn_dim": 1024, "num_encoder_layers": 6,
         "num_decoder_layers": 6}  # fmt: skip
QUICK_SHAPE = {"dim": 64, "num_heads": 4, "ffn_dim": 128, "num_encoder_layers": 2,
               "num_decoder_layers": 2}  # fmt: skip
ENCODER_FEATURES, DECODER_FEATURES = 16, 24
CONFIGS: dict[str, dict[str, Any]] = {
    SOFTMAX: {"encoder_attention": "softmax", "decoder_attention": "softmax",
              "cross_attention": "softmax"},
    "nprf_rpe": {
        "encoder_attention": "nprf_rpe",
        "encoder_options": {"num_features": ENCODER_FEATURES},
        "decoder_attention": "nprf_rpe",
        "decoder_options": {"rpe": "decay", "num_features": DECODER_FEATURES},
        "cross_attention": "kernelized",
        "cross_options": {"feature_map": "prf", "normalize_qk": True,
                          "num_features": DECODER_FEATURES},
    },
}  # fmt: skip


def build(name: str, shape: dict[str, int], vocab: int, max_len: int) -> Seq2Seq:
    torch.manual_seed(0)
    model = Seq2Seq(vocab, vocab, **shape, **CONFIGS[name], max_len=max_len,
                    positions="sinusoidal", dropout=0.0, share_embeddings=True)  # fmt: skip
    return model.eval()


def token_ids(length: int, vocab: int, seed: int) -> Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def check_decoding(models: dict[str, Seq2Seq], vocab: int, length: int) -> dict[str, float]:
    """Max abs difference of ``decode_step`` logits from the teacher-forced forward."""
    src, tgt = token_ids(length, vocab, 1), token_ids(length, vocab, 2)
    errors = {}
    with torch.inference_mode():
        for name, model in models.items():
            expected = model(src, tgt)
            state = model.init_decoding(model.encode(src))
            rows = []
            for t in range(length):
                logits, state = model.decode_step(tgt[:, t], state)
                rows.append(logits)
            errors[name] = float((torch.stack(rows, dim=1) - expected).abs().max())
    for name, err in errors.items():
        if not err <= 1e-4:
            raise SystemExit(f"correctness check failed: {name} decoding differs by {err:.3g}")
    return errors


def decode_once(model: Seq2Seq, length: int, vocab: int, window: int) -> dict[str, Any]:
    """Encode an L-token source, build the cross caches, decode L target tokens one by one."""
    src, tgt = token_ids(length, vocab, 10 + length), token_ids(length, vocab, 20 + length)
    start = time.perf_counter()
    memory = model.encode(src)
    encoded = time.perf_counter()
    state: Seq2SeqState = model.init_decoding(memory)
    cached = time.perf_counter()
    steps = []
    for t in range(length):
        t0 = time.perf_counter()
        _, state = model.decode_step(tgt[:, t], state)
        steps.append(time.perf_counter() - t0)
    blocks = [sum(steps[i : i + window]) / len(steps[i : i + window])
              for i in range(0, length, window)]  # fmt: skip
    return {
        "encode_seconds": encoded - start,
        "cross_cache_seconds": cached - encoded,
        "first_seconds": sum(steps[:window]) / window,
        "last_seconds": sum(steps[-window:]) / window,
        "all_seconds": sum(steps) / length,
        "block_seconds": blocks,
        **state_bytes(state),
        "position": state.position,
    }


def probe_encodings(positions: tuple[int, int], steps: int, head_dim: int) -> list[dict]:
    """For each 1-D relative encoding with a recurrent form: one ``nprf_rpe`` attention (B=1, 4
    heads, M = 24) read to each position with ``prefill``, then ``steps`` timed ``step`` calls;
    the state's bytes after them and the median time per step."""
    rows = []
    for rpe in kattn.positional.available():
        planar = "grid" in kattn.positional.option_names(rpe)  # 2-D: images, not sentences
        if planar or not kattn.positional.get(rpe).supports_recurrent:
            continue
        torch.manual_seed(0)
        attn = kattn.build("nprf_rpe", head_dim=head_dim, num_heads=4,
                           max_len=positions[-1] + steps, rpe=rpe,
                           num_features=DECODER_FEATURES).eval()  # fmt: skip
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 4, positions[-1] + steps, head_dim, generator=g) for _ in "qkv")
        state, done = None, 0
        for position in positions:
            _, state = attn.prefill(q[:, :, done:position], k[:, :, done:position],
                                    v[:, :, done:position], state)  # fmt: skip
            times = []
            for t in range(position, position + steps):
                t0 = time.perf_counter()
                _, state = attn.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1],
                                     state)  # fmt: skip
                times.append(time.perf_counter() - t0)
            done = position + steps
            rows.append({"rpe": rpe, "position": position, "step_seconds":
                         statistics.median(times), "state_bytes": tensor_bytes(state)})  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="512,2048", help="source = target lengths")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--window", type=int, default=128, help="steps averaged at each end")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--probe-positions", default="256,2048")
    parser.add_argument("--probe-steps", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="a tiny model, short lengths")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.rounds, args.window = "16,32", 2, 4
        args.probe_positions, args.probe_steps = "8,24", 4
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.probe_positions = tuple(int(x) for x in args.probe_positions.split(","))
    first, second = args.probe_positions
    if second < first + args.probe_steps:
        parser.error("--probe-positions: the second must follow the first's timed steps")
    if min(args.lengths) < args.window:
        parser.error(f"--window {args.window} is longer than the shortest length")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape, vocab = (QUICK_SHAPE, QUICK_VOCAB) if args.quick else (SHAPE, VOCAB)
    load_start, start = os.getloadavg(), time.perf_counter()
    max_len = max(args.lengths)
    models = {name: build(name, shape, vocab, max_len) for name in CONFIGS}
    check_length = min(24, max_len)
    correctness = check_decoding(models, vocab, check_length)
    runs = []
    with torch.inference_mode():
        for model in models.values():  # warm-up: allocator, kernels, the rpe's first FFT
            decode_once(model, args.window, vocab, args.window)
        for r in range(args.rounds):
            for length in args.lengths:
                order = list(models) if r % 2 == 0 else list(models)[::-1]
                for name in order:
                    run = decode_once(models[name], length, vocab, args.window)
                    runs.append({"round": r, "length": length, "config": name, **run})
                    print(f"round {r + 1}/{args.rounds} L={length} {name}: encode "
                          f"{run['encode_seconds']:.2f} s, {run['all_seconds'] * 1e3:.2f} "
                          "ms/token", flush=True)  # fmt: skip
        probe = probe_encodings(args.probe_positions, args.probe_steps, shape["dim"] // 4)
    info = machine_info()
    report: dict[str, Any] = {
        "machine": info,
        "command": " ".join(["python", "benchmarks/seq2seq_decode_speed.py", *sys.argv[1:]]),
        "environment": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "config": {
            "model": "kattn.nn.Seq2Seq",
            **shape,
            "vocab_size": vocab,
            "share_embeddings": True,
            "positions": "sinusoidal",
            "dtype": "float32",
            "batch": 1,
            "parameters": sum(p.numel() for p in models[SOFTMAX].parameters()),
            "configs": CONFIGS,
            "lengths": args.lengths,
            "rounds": args.rounds,
            "window": args.window,
            "threads": args.threads,
            "probe_positions": list(args.probe_positions),
            "probe_steps": args.probe_steps,
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "correctness_length": check_length,
        "correctness_max_abs_error": correctness,
        "runs": runs,
    }
    report["summary"] = summarise(runs)
    report["ratios"] = ratios(runs)
    report["rpe_probe"] = probe
    report["wall_seconds"] = time.perf_counter() - start
    write_run(args.out, "seq2seq-decode", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
