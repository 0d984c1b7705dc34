"""The quoted sentences: each page's sentences as templates, with the values they take from
their result files."""

from __future__ import annotations

from .entries import Quote
from .quote_values import (
    FFK,
    blocked,
    crossover,
    doublings,
    error,
    exponent,
    largest_gradient_step,
    learned,
    learned_min_round,
    lm,
    lm_ratio,
    lm_target,
    lm_train_row,
    nystrom,
    nystrom_memory,
    nystrom_range,
    pinv,
    ratio,
    spectral,
    speed,
)
from .sources import (
    BENCH_TIME,
    DEMO_RUNS,
    DEMO_TIME,
    FOUNDATION,
    LEARNED,
    LM,
    MECHANISMS,
    NYSTROM,
    PINV_INIT,
    RPE,
    RPE_BLOCKED,
    SPECTRAL,
    SPEED,
    SPEED_RPE,
    STABILITY,
    mib,
)
from .tables_nystrom import seed_means


def _minutes_seconds(run: dict) -> tuple[int, int]:
    return divmod(round(run["seconds"]), 60)


def _accuracy_range(*runs: dict) -> tuple[float, float]:
    accuracies = [100 * run["test_accuracy"] for run in runs]
    return min(accuracies), max(accuracies)


QUOTES: list[Quote] = [
    # README.md
    Quote("README.md", (DEMO_TIME,), "From a fresh clone, `make demo` took {} min {} s",
          _minutes_seconds),
    Quote("README.md", (DEMO_TIME,), "`make demo` took {} min {} s, set-up included",
          _minutes_seconds),
    Quote("docs/performance.md", (BENCH_TIME,),
          "from a fresh clone on the 2-core development machine it took {} min {} s after "
          "set-up", _minutes_seconds),
    Quote("docs/choosing-a-mechanism.md", DEMO_RUNS,
          "softmax, performer, nprf_rpe, skyformer and gmm_prf all reached {:.0f}–{:.0f}% test "
          "accuracy", _accuracy_range),
    Quote("README.md", (LM,),
          "`performer` decodes {:.0f}× faster per token than `softmax`'s key/value cache "
          "({:.0f}× with M=64), from a state {:.0f}× smaller ({:.0f} MiB against {:,.0f} MiB; "
          "{:.1f} MiB with M=64",
          lambda d: (lm_ratio(d, "performer"), lm_ratio(d, "performer M=64"),
                     lm(d, 16, 8192, "softmax")["state_bytes_filled"]
                     / lm(d, 16, 8192, "performer")["state_bytes_filled"],
                     mib(lm(d, 16, 8192, "performer")["state_bytes_filled"]),
                     mib(lm(d, 16, 8192, "softmax")["state_bytes_filled"]),
                     mib(lm(d, 16, 8192, "performer M=64")["state_bytes_filled"]))),
    Quote("README.md", (RPE,),
          "the exact banded path of `rpe=\"bucketed\"` is {:.0f}× faster than the FFT algorithm "
          "of the paper at L=16384 and within {:.1f}× of plain `performer`",
          lambda d: (ratio(d, "non-causal: banded vs FFT"),
                     ratio(d, "non-causal: banded / performer"))),
    Quote("README.md", (RPE,),
          "({:.0f} µs at position 128, {:.0f} µs at 16320)",
          lambda d: (1e6 * d["decode_seconds_per_token"]["decay"]["128"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["16320"])),
    Quote("README.md", (NYSTROM,),
          "`nystromformer` {:.1f}× and `skyformer` {:.1f}× faster than PyTorch's fused softmax "
          "({:.1f}–{:.1f}× and {:.1f}–{:.1f}× per round), {:.0f}× and {:.0f}× faster than "
          "materialised softmax with {:.0f}% and {:.0f}% of its memory",
          lambda d: (nystrom(d, "nystromformer"), nystrom(d, "skyformer"),
                     *nystrom_range(d, "nystromformer"), *nystrom_range(d, "skyformer"),
                     nystrom(d, "nystromformer", "softmax (materialised)"),
                     nystrom(d, "skyformer", "softmax (materialised)"),
                     nystrom_memory(d, "nystromformer"), nystrom_memory(d, "skyformer"))),
    Quote("README.md", (SPECTRAL,),
          "({:.2f} → {:.3f} relative spectral error from 16 to 256 at L=1024",
          lambda rows: (spectral(rows, 16), spectral(rows, 256))),
    Quote("README.md", (LEARNED,),
          "`gmm_rks` {:.1f}×, `gmm_prf` {:.1f}×, `fastfood_rks` {:.1f}×, `fastfood_prf` {:.1f}×, "
          "`generative_rks` {:.1f}×, `generative_prf` {:.1f}×, feed-forward kernels "
          "{:.1f}–{:.1f}×, `simpletron` {:.0f}× faster",
          lambda d: (*(learned(d, n) for n in ("gmm_rks", "gmm_prf", "fastfood_rks",
                                                "fastfood_prf", "generative_rks",
                                                "generative_prf")),
                     min(learned(d, n) for n in FFK), max(learned(d, n) for n in FFK),
                     learned(d, "simpletron"))),
    Quote("README.md", (FOUNDATION,),
          "{:.0f} MiB for causal `performer` at L=8192, where the cumulative-sum formulation "
          "needs {:.0f} MiB",
          lambda d: (mib(d["peak_memory_bytes"]["8192"]["performer causal"]),
                     mib(d["peak_memory_bytes"]["8192"]["cumsum causal"]))),
    # docs/performance.md
    Quote("docs/performance.md", (FOUNDATION,),
          "needs L·M·Dv numbers, {:.0f} MiB at L=8192",
          lambda d: (mib(d["peak_memory_bytes"]["8192"]["cumsum causal"]),)),
    Quote("docs/performance.md", (FOUNDATION,),
          "roughly 6 ms of the {:.1f} ms",
          lambda d: (1000 * d["seconds"]["performer causal"],)),
    Quote("docs/performance.md", (RPE,),
          "is {:.1f}× faster than the FFT path of `rpe=\"toeplitz\"` non-causal ({:.1f}× causal) "
          "and takes {:.2f}× the time of plain `performer` non-causal ({:.2f}× causal)",
          lambda d: (ratio(d, "non-causal: banded vs FFT"), ratio(d, "causal: banded vs FFT"),
                     ratio(d, "non-causal: banded / performer"),
                     ratio(d, "causal: banded / performer"))),
    Quote("docs/performance.md", (RPE,),
          "the FFT path beats the blocked exact form from L = {} on ({:.1f}× faster at "
          "L = 16384); `decay` decoding costs {:.0f} µs per token at position 128 and {:.0f} µs "
          "at 16320",
          lambda d: (d["fft_vs_dense_crossover_length"],
                     d["sweep_seconds"]["16384"]["dense"] / d["sweep_seconds"]["16384"]["fft"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["128"],
                     1e6 * d["decode_seconds_per_token"]["decay"]["16320"])),
    Quote("docs/performance.md", (NYSTROM,),
          "`nystromformer` {:.1f}× and `skyformer` {:.1f}× faster than the fused softmax (per "
          "round {:.1f}–{:.1f}× and {:.1f}–{:.1f}×), {:.0f}× and {:.0f}× faster than the "
          "materialised softmax with {:.0f}% and {:.0f}% of its peak memory",
          lambda d: (nystrom(d, "nystromformer"), nystrom(d, "skyformer"),
                     *nystrom_range(d, "nystromformer"), *nystrom_range(d, "skyformer"),
                     nystrom(d, "nystromformer", "softmax (materialised)"),
                     nystrom(d, "skyformer", "softmax (materialised)"),
                     nystrom_memory(d, "nystromformer"), nystrom_memory(d, "skyformer"))),
    Quote("docs/performance.md", (LEARNED,),
          "against the fused softmax ({:.1f} ms), one run, medians of 7 interleaved rounds: every "
          "one is faster — `gmm_rks` {:.1f}×, `gmm_prf` {:.1f}×, `fastfood_rks` {:.1f}×, "
          "`fastfood_prf` {:.1f}×, `generative_rks` {:.1f}×, `generative_prf` {:.1f}×, the "
          "feed-forward kernels {:.1f}–{:.1f}× (`ffk_vae` {:.1f}×), `simpletron` {:.0f}×; the "
          "slowest single round of any of them was {:.1f}×",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],
                     *(learned(d, n) for n in ("gmm_rks", "gmm_prf", "fastfood_rks",
                                                "fastfood_prf", "generative_rks",
                                                "generative_prf")),
                     min(learned(d, n) for n in FFK if n != "ffk_vae"),
                     max(learned(d, n) for n in FFK), learned(d, "ffk_vae"),
                     learned(d, "simpletron"), learned_min_round(d))),
    # docs/learned-kernels.md and docs/feedforward-kernels.md
    Quote("docs/learned-kernels.md", (LEARNED,),
          "against PyTorch's fused softmax ({:.1f} ms)",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],)),
    Quote("docs/feedforward-kernels.md", (LEARNED,),
          "against the fused softmax ({:.1f} ms), medians of 7 interleaved rounds "
          "(`benchmarks/learned_speed.py`, `benchmarks/results/learned-cpu-*.md`): "
          + ", ".join(f"`{n}` {{:.1f}} ms ({{:.1f}}×)" for n in FFK) + ".",
          lambda d: (1000 * d["seconds"]["4096"]["softmax"],
                     *(v for n in FFK for v in (1000 * d["seconds"]["4096"][n],
                                                learned(d, n))))),
    # docs/rpe.md
    Quote("docs/rpe.md", (RPE,),
          "At M = 32 the FFT wins non-causal from L = {} on",
          lambda d: (d["fft_vs_dense_crossover_length"],)),
    # docs/language-modelling.md
    Quote("docs/language-modelling.md", (LM,),
          "`performer` at context 8192 takes {:.2f}× (B=1) and {:.2f}× (B=16) its time at 512",
          lambda d: (lm_target(d, "decode B=1: performer at 8192 / at 512")["value"],
                     lm_target(d, "decode B=16: performer at 8192 / at 512")["value"])),
    Quote("docs/language-modelling.md", (LM,),
          "({:,.0f} MiB for 16 sequences at 8192 tokens)",
          lambda d: (mib(lm(d, 16, 8192, "softmax")["state_bytes_filled"]),)),
    Quote("docs/language-modelling.md", (LM,),
          "`softmax` is **{:.1f}× slower per token than `performer`** with its default 256 "
          "features (per round {:.1f}–{:.1f}×), **{:.1f}×** slower than `performer` with M=64",
          lambda d: (lm_ratio(d, "performer"),
                     *(f(lm_target(d, "decode B=16: softmax / performer at context 8192")
                         ["rounds"]) for f in (min, max)),
                     lm_ratio(d, "performer M=64"))),
    Quote("docs/language-modelling.md", (LM,),
          "and **{:.1f}×** slower than `nprf_rpe` with `rpe=\"decay\"`",
          lambda d: (lm_ratio(d, "nprf_rpe decay M=64"),)),
    Quote("docs/language-modelling.md", (LM,),
          "at B=16 the recurrent state is {:.0f} MiB per layer",
          lambda d: (mib(lm(d, 16, 8192, "performer")["state_bytes_filled"])
                     / d["config"]["depth"],)),
    Quote("docs/language-modelling.md", (LM,),
          "At B=1 the ratio at 8192 is only {:.1f}×",
          lambda d: (lm_ratio(d, "performer", batch=1),)),
    Quote("docs/language-modelling.md", (LM,),
          "than `softmax`'s {:.2f} ms here",
          lambda d: (1000 * lm(d, 1, 8192, "softmax")["step_seconds"],)),
    Quote("docs/language-modelling.md", (LM,),
          "without any attention the step is only {:.2f}× faster than `softmax`'s, because "
          "`softmax` (PyTorch's fused `scaled_dot_product_attention`) spends {:.2f} s of its "
          "{:.2f} s step on attention and the shared {:.2f} s stays",
          lambda d: (lm_train_row(d, 4096, "no attention (ceiling)")["tokens_per_second"]
                     / lm_train_row(d, 4096, "softmax")["tokens_per_second"],
                     lm_train_row(d, 4096, "softmax")["step_seconds"]
                     - lm_train_row(d, 4096, "no attention (ceiling)")["step_seconds"],
                     lm_train_row(d, 4096, "softmax")["step_seconds"],
                     lm_train_row(d, 4096, "no attention (ceiling)")["step_seconds"])),
    Quote("docs/language-modelling.md", (LM,),
          "`performer` M=64 is {:.2f}× at 8192 tokens",
          lambda d: (lm_train_row(d, 8192, "performer M=64")["tokens_per_second"]
                     / lm_train_row(d, 8192, "softmax")["tokens_per_second"],)),
    Quote("docs/language-modelling.md", (LM,),
          "while `softmax`'s grows {:.1f}×",
          lambda d: (lm_train_row(d, 8192, "softmax")["step_seconds"]
                     / lm_train_row(d, 1024, "softmax")["step_seconds"],)),
    # docs/nystrom.md
    Quote("docs/nystrom.md", (NYSTROM,),
          "Skyformer is **{:.1f}×** faster (per round {:.1f}–{:.1f}×) and Nyströmformer "
          "**{:.1f}×** ({:.1f}–{:.1f}×). The margin over the {:.0f}× target is thin",
          lambda d: (nystrom(d, "skyformer"), *nystrom_range(d, "skyformer"),
                     nystrom(d, "nystromformer"), *nystrom_range(d, "nystromformer"),
                     d["targets"]["speedup_at_least"])),
    Quote("docs/nystrom.md", (NYSTROM,),
          "Against the materialised softmax they are {:.0f}× and {:.0f}× faster and take {:.0f}% "
          "and {:.0f}% of its memory. They cannot take less memory than the fused kernel, whose "
          "peak ({:.1f} MiB)",
          lambda d: (nystrom(d, "skyformer", "softmax (materialised)"),
                     nystrom(d, "nystromformer", "softmax (materialised)"),
                     nystrom_memory(d, "skyformer"), nystrom_memory(d, "nystromformer"),
                     mib(d["peak_memory_bytes"]["4096"]["softmax"]))),
    Quote("docs/nystrom.md", (NYSTROM,),
          "at L = 8192 they are {:.0f}× and {:.0f}× faster",
          lambda d: (nystrom(d, "skyformer", length="8192"),
                     nystrom(d, "nystromformer", length="8192"))),
    Quote("docs/nystrom.md", (SPECTRAL,),
          "(×{:.2f}–{:.2f} per doubling",
          lambda rows: (min(doublings(rows)), max(doublings(rows)))),
    Quote("docs/nystrom.md", (STABILITY,),
          "the per-seed means range from {:.2f} to {:.2f} (Gaussian) and {:.2f} to {:.2f} "
          "(Skyformer), and single steps swing between {:.2f} and {:.1f}",
          lambda d: (min(seed_means(d, "gaussian")), max(seed_means(d, "gaussian")),
                     min(seed_means(d, "skyformer")), max(seed_means(d, "skyformer")),
                     *(f(r["ratio"] for r in d["rows"]
                         if r["mechanism"] in ("gaussian", "skyformer")) for f in (min, max)))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "JSON beside it; {:.0f} s on the shared 2-core development machine",
          lambda d: (sum(d["wall_seconds"].values()),)),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "from the identity it is the exact inverse's ({:.4f}, what γ leaves), from the "
          "transposed starts {:.0f}–{:.0f} times that. With sampled landmarks the Nyström error "
          "itself ({:.3f} at L = 256, {:.3f} at 1024, the exact inverse's) dominates, and the "
          "transposed starts add {:.1f}–{:.0f}% of the output on top",
          lambda d: (pinv(d, 64, "exact inverse")["vs_gaussian"],
                     *(f(pinv(d, 64, i)["vs_gaussian"] / pinv(d, 64, "identity")["vs_gaussian"]
                         for i in ("global", "per_matrix")) for f in (min, max)),
                     pinv(d, 256, "exact inverse")["vs_gaussian"],
                     pinv(d, 1024, "exact inverse")["vs_gaussian"],
                     *(f(100 * pinv(d, n, i)["vs_exact_inverse"] for n in (256, 1024)
                         for i in ("global", "per_matrix")) for f in (min, max)))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "Its inverse error there ({}, {})",
          lambda d: (exponent(pinv(d, 256, "identity")["inverse"]),
                     exponent(pinv(d, 1024, "identity")["inverse"]))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "(median {:.4f} at L = 256)",
          lambda d: (pinv(d, 256, "exact inverse")["median_smallest_eigenvalue"],)),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "the instability scores differ by {:.1f}%. The largest gradient norms come where the "
          "loss falls (identity at steps {} and {}, global at step {} of its second seed",
          lambda d: (100 * (max(s["tau_ratio_to_softmax"] for s in d["training"]["summary"]
                                .values())
                            / min(s["tau_ratio_to_softmax"] for s in d["training"]["summary"]
                                  .values()) - 1),
                     largest_gradient_step(d, "identity", 0),
                     largest_gradient_step(d, "identity", 1),
                     largest_gradient_step(d, "global", 1))),
    Quote("docs/nystrom.md", (PINV_INIT,),
          "(20-step mean loss below {:g} after {} and {} steps)",
          lambda d: (d["config"]["learned_loss"],
                     *d["training"]["summary"]["identity"]["steps_to_learned_loss"])),
    # docs/simpletron.md
    Quote("docs/simpletron.md", (LEARNED,),
          "L=4096: {:.1f} ms against {:.1f} ms for PyTorch's fused softmax ({:.0f}×, per round "
          "{:.0f}–{:.0f}×",
          lambda d: (1000 * d["seconds"]["4096"]["simpletron"],
                     1000 * d["seconds"]["4096"]["softmax"], learned(d, "simpletron"),
                     *(f(s / m for s, m in zip(d["round_seconds"]["4096"]["softmax"],
                                               d["round_seconds"]["4096"]["simpletron"],
                                               strict=True)) for f in (min, max)))),
    # docs/choosing-a-mechanism.md
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "nothing with 256 random features beats it below about {:,.0f} tokens",
          lambda d: (min(crossover(d, n) for n in ("performer", "rfa", "gmm_prf")),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "faster than softmax from about 1K tokens ({:.2g}× at 4K, {:.2g}× at 16K) and causal "
          "with O(1) decoding, at {:.2g}× softmax's memory at 16K",
          lambda d: (speed(d, "performer", 4096)["speedup"],
                     speed(d, "performer", 16384)["speedup"],
                     speed(d, "performer", 16384)["memory_ratio"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "({:.2f} with 256 features)",
          lambda d: (error(d, "performer"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED, MECHANISMS),
          "({:.2f} against exact Gaussian-kernel attention), faster than softmax from about "
          "{:.1f}K tokens ({:.2g}× at 16K)",
          lambda s, e: (error(e, "skyformer"), crossover(s, "skyformer") / 1000,
                        speed(s, "skyformer", 16384)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (SPEED, MECHANISMS),
          "{:.2f} error, {:.0f}× faster at 4K and {:.2g}× at 16K",
          lambda s, e: (error(e, "nystromformer"), speed(s, "nystromformer", 4096)["speedup"],
                        speed(s, "nystromformer", 16384)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "(linear {:.2g}× at 4K, simpletron {:.2g}×)",
          lambda d: (speed(d, "linear", 4096)["speedup"],
                     speed(d, "simpletron", 4096)["speedup"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "(relative error {:.1f}, untrained projections)",
          lambda d: (error(d, "linformer"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "(faster from about {:.1f}–{:.1f}K); the RKS forms (cos and sin features; full "
          "covariances for `gmm_rks`) win later (≈ {:.1f}–{:.1f}K) and take {:.0f}× the memory "
          "of the PRF forms",
          lambda d: (
              min(crossover(d, n) for n in ("gmm_prf", "fastfood_prf", "generative_prf")) / 1000,
              max(crossover(d, n) for n in ("gmm_prf", "fastfood_prf", "generative_prf")) / 1000,
              min(crossover(d, n) for n in ("gmm_rks", "fastfood_rks", "generative_rks")) / 1000,
              max(crossover(d, n) for n in ("gmm_rks", "fastfood_rks", "generative_rks")) / 1000,
              speed(d, "gmm_rks", 16384)["memory_ratio"]
              / speed(d, "gmm_prf", 16384)["memory_ratio"])),
    Quote("docs/choosing-a-mechanism.md", (MECHANISMS,),
          "({:.2f} against softmax of unit q, k)",
          lambda d: (error(d, "nprf_rpe"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED_RPE,),
          "they run at about {:.2f}–{:.2f}× softmax's speed at 1K–16K on this CPU",
          lambda d: (min(r["speedup"] for r in d["rows"] if r["mechanism"] != "softmax"),
                     max(r["speedup"] for r in d["rows"] if r["mechanism"] != "softmax"))),
    Quote("docs/choosing-a-mechanism.md", (RPE_BLOCKED,),
          "the FFT of the paper is {:.0f}× slower still at 4K",
          lambda d: (blocked(d, 256, 4096, "forward"),)),
    Quote("docs/choosing-a-mechanism.md", (SPEED,),
          "the run of 2026-11-22, with the FFT, had {:.2f}× at 4K, {:.0f}× the memory and 16K "
          "skipped (a call predicted at {:.0f} s)",
          lambda d: (speed(d, "nprf_rpe", 4096)["speedup"],
                     speed(d, "nprf_rpe", 4096)["memory_ratio"],
                     float(speed(d, "nprf_rpe", 16384)["status"].split()[2]))),
    Quote("docs/choosing-a-mechanism.md", (SPEED_RPE,),
          "with {:.1f}–{:.1f}× its memory",
          lambda d: (min(r["memory_ratio"] for r in d["rows"] if r["mechanism"] != "softmax"),
                     max(r["memory_ratio"] for r in d["rows"] if r["mechanism"] != "softmax"))),
]  # fmt: skip
