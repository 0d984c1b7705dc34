"""Passages listed instead of quoted: measurements with no committed result file yet
(``UNRECORDED``, each with what to commit) and numbers that are not measurements
(``NOT_MEASURED``, each with the reason)."""

from __future__ import annotations

from .entries import NotMeasured, Unrecorded

LISTOPS_RUNS = "the four runs' results.json and metrics.jsonl under benchmarks/results/listops/"
LM_RUNS = "the LM runs' results.json (and the sample) under benchmarks/results/lm-train/"

U, N = Unrecorded, NotMeasured
UNRECORDED: list[Unrecorded] = [
    U("README.md", "— 40.5% test accuracy in 3.5 minutes on a 2-core CPU (softmax: 42.2% in 2.3 "
      "minutes; the majority class is 15.7%)", False, LISTOPS_RUNS),
    U("README.md", "On the embedded corpus a 2-layer byte-level model reaches 2.51 (`softmax`, "
      "96 s), 2.93 (`performer`, M=64) and 2.66 (`nprf_rpe` with `rpe=\"decay\"`) test bits "
      "per byte after 1000 steps on a 2-core CPU, against 4.52 for the unigram baseline",
      False, LM_RUNS),
    U("docs/performance.md", "at about 160 GFLOP/s in isolation on this machine (a one-off "
      "measurement, not committed), so roughly 6 ms", False,
      "a script that times batched 64×64 matrix products, and its result file"),
    U("docs/language-modelling.md", "231 files, 3.6 MB train / 200 KB valid / 200 KB test",
      False, LM_RUNS),
    U("docs/language-modelling.md", "0.46 M parameters); bits per byte of the best checkpoint "
      "on the whole test split. The **unigram baseline is 4.519 bits per byte**.", False,
      LM_RUNS),
    U("docs/language-modelling.md", "| mechanism | steps | test bits/byte |", True, LM_RUNS),
    U("docs/language-modelling.md", "`performer` (2.66 against 2.93 bits per byte after 1000 "
      "steps), at about a quarter of `softmax`'s tokens/s", False, LM_RUNS),
    U("docs/language-modelling.md", "A sample after 96 s of training", False, LM_RUNS),
    U("docs/reproducing-lra.md", "**15.7%**", False, LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "| task | preset | mechanism | steps | test accuracy |", True,
      LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "that run was 3.1× slower than softmax", False, LISTOPS_RUNS),
    U("docs/reproducing-lra.md", "falls to 16–24% and recovers", False, LISTOPS_RUNS),
    U("docs/nystrom.md", "Skyformer forward + backward 18 ms at the scale above versus 130 ms at "
      "three times it. The exact inverse, `pinv_iterations=None` (an LU solve of the 128 × 128 "
      "system), took 11 ms and 25 ms in the same two cases", False,
      "a script that times skyformer at L = 4096 at one and three times the input scale, "
      "iterative and exact inverse, on the Intel Xeon, and its result file under "
      "benchmarks/results/"),
]  # fmt: skip

NOT_MEASURED: list[NotMeasured] = [
    N("docs/api.md", "dropout=0.0, attention_dropout=0.0, norm_first=True, embedding_std=0.02",
      False, "defaults"),
    N("docs/api.md", "N(0, 0.02²)", False, "an initialisation"),
    N("docs/choosing-a-mechanism.md", "q, k ~ N(0, 0.55²)", False, "inputs of the error study"),
    N("docs/feedforward-kernels.md", "| name | φ(x) |", True, "defaults"),
    N("docs/feedforward-kernels.md", "| option | maps | default | meaning |", True, "defaults"),
    N("docs/feedforward-kernels.md", "The thesis chose λ = 0.1", False, "the paper's setting"),
    N("docs/kernelized.md", "below 0.12 at M = 1024 (q, k ~ N(0, 0.25), D = 16, L = 128)", False,
      "a bound tests/attention/test_kernelized.py checks, and its inputs"),
    N("docs/nystrom.md", "(the released code uses 0.1)", False, "a setting"),
    N("docs/nystrom.md", "1 MiB of rows at a time, at most 8 blocks", False, "settings"),
    N("docs/nystrom.md", "q, k and v (4 MiB at this size)", False,
      "counted: 4 × 4096 × 2 × 32 × 4 B"),
    N("docs/nystrom.md", "(L, 128) kernel matrices (4 MiB each)", False,
      "counted: 4096 × 128 × 2 heads × 4 B"),
    N("docs/nystrom.md", "128 × 128", False, "a shape"),
    N("docs/nystrom.md", "N(0, 0.554²)", False, "inputs of the studies"),
    N("docs/nystrom.md", "8 × 512 synthetic tokens", False, "a setting"),
    N("docs/nystrom.md", "N(0, 0.02²)", False, "an initialisation"),
    N("docs/nystrom.md", "grows by 3.25 a step", False, "arithmetic: the step's 13/4 on a zero "
      "eigenvalue"),
    N("docs/nystrom.md", "still more than 10% off after 6 steps", False,
      "a bound tests/functional/test_gaussian_nystrom.py checks"),
    N("docs/learned-kernels.md", "4 × (Linear, BatchNorm, LeakyReLU)", False, "an architecture"),
    N("docs/learned-kernels.md", "64×64 matmul", False, "a shape"),
    N("docs/performance.md", "20× target", False, "a target"),
    N("docs/performance.md", "0.95 GFLOP", False, "counted, not measured"),
    N("docs/performance.md", "2 × 134 M", False, "counted"),
    N("docs/performance.md", "Batched 64×64 products", False, "a shape"),
    N("docs/performance.md", "use IEEE fp32 products above 128 × 128 (M = 256 with Dv = 128)",
      False, "a tile size of the kernels"),
    N("docs/performance.md", "64 tokens up to 64 × 64, 32 up to 128 × 128, 16", False,
      "the kernels' chunk sizes by tile size"),
    N("docs/language-modelling.md", "≥ 3×", False, "a target"),
    N("docs/language-modelling.md", "the first 4 MB", False, "a setting"),
    N("docs/reproducing-lra.md", "7.7 GB", False, "a download's size"),
    N("docs/reproducing-lra.md", "the last 10% of the training batches", False, "a split"),
    N("docs/reproducing-lra.md", "warms up for 30% of the run instead", False, "a setting"),
    N("docs/reproducing-lra.md", "| | `skyformer` | `lra` | `kl` | `small` |", True, "presets"),
    N("docs/reproducing-lra.md", "the standard error of an accuracy near 40% is 1.1 points", False,
      "arithmetic: √(0.4·0.6/2000)"),
    N("docs/sparse.md", "Child et al. 2019, §4.2–4.3", False, "a section of a paper"),
    N("docs/api.md", "Vyas et al. 2020 §3.2–3.3", False, "a section of a paper"),
    N("docs/api.md", "Peng et al. 2021 §3.3", False, "a section of a paper"),
    N("docs/pretraining.md", "Yorsh (2022, §4.3.2.2, Tables 4.2 and 4.3)", False,
      "a section of a thesis"),
    N("docs/pretraining.md", "decay (their 0.9 per layer)", False, "a setting of the thesis"),
    N("docs/sparse.md", "(standard error about 1.1 points)", False, "arithmetic: √(0.4·0.6/2000)"),
    N("docs/translation.md", "mean ± 95% confidence interval over the seeds", False,
      "what a study reports"),
    N("docs/vision.md", "Table 4: NPRF with RPE 80.9% top-1 against DeiT-base's 81.2%, 77.7% "
      "without RPE), and ImageNet32 generation over 3,072 sub-pixels (Appendix A.5, Table 6: "
      "3.68 bits/dim)", False, "the paper's reported results"),
    N("docs/vision.md", "(224×224, 16×16 patches, DeiT's sizes and parameter counts with a class "
      "token) and `small` (32×32, 4×4 patches, for a CPU)", False, "preset sizes"),
    N("docs/vision.md", "| format | what `--data` names | splits |", True, "data formats"),
    N("docs/vision.md", "at 32×32 RGB", False, "the embedded images' size"),
    N("docs/vision.md", "1.0 turns it off", False, "a setting"),
    N("docs/vision.md", "on 4×4 patches of 64², 128² and 224² images", False,
      "the benchmark's sizes"),
    N("docs/vision.md", "at 16×16 patches and gigabytes of spectra at 64×64", False,
      "the benchmark's sizes and an estimate of the FFT's spectra (B·H·M·Dv channels of the "
      "doubled grid)"),
    N("docs/vision.md", "`luo-deit` follows Appendix A.4 and DeiT: AdamW (0.9, 0.999), eps "
      "1e-8, weight decay 0.05, batch 1,024, 450 epochs of cosine decay after 20 of warm-up, "
      "label smoothing 0.1, RandAugment, mixup 0.8, CutMix 1.0, stochastic depth 0.1, M = 32.",
      False, "preset settings"),
    N("docs/vision.md", "`luo-imagenet32` follows Appendix A.5 (6 layers, 512, 8 heads, M = 32, "
      "batch 64, Adam (0.9, 0.98), eps 1e-6, dropout 0.1, weight decay 0.01, peak learning "
      "rate 5e-4)", False, "preset settings"),
]  # fmt: skip
