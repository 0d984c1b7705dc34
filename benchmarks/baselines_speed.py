"""Speed and peak memory of the content-based and learned baselines against dense softmax and
against the peer packages, on the CPU.

One run on one machine: B=1, H=4, D=Dv=64, fp32, L = 1K, 4K, 16K, every mechanism with its
registered defaults (``kattn.build(name, head_dim=64, num_heads=4, max_len=L)``).

* Non-causal rows: the dense baseline ``sdpa`` (PyTorch's fused
  ``scaled_dot_product_attention``), ``reformer`` (Kitaev et al. 2020), ``smyrf`` (Daras et al.
  2020), ``clustered`` and ``improved_clustered`` (Vyas et al. 2020), ``sinkhorn`` (Tay et al.
  2020), ``synthesizer`` (Tay et al. 2021) and ``informer`` (Zhou et al. 2021); and, where the
  packages are importable (``--peer-site`` adds a site-packages folder to the path), lucidrains'
  ``reformer-pytorch`` ``LSHAttention`` (bucket 64, 2 hashes, as kattn's defaults; one hash
  of L/64 buckets where kattn's default is the paper's 2L/64, hashed as two factors beyond
  Hugging Face's limit, 16·32 at 16K; so the row ``reformer nb=L/m`` runs kattn's
  ``reformer`` with the peer's hash, one of L/64 buckets, beside it) and
  ``sinkhorn-transformer`` ``SinkhornAttention`` (block 64, as kattn's). Rows whose
  ``(B, H, L, L)`` fp32 scores exceed ``--memory-cap-gb`` (SDPA, whose time grows with them)
  or ``--stored-cap-gb`` (synthesizer, which stores them) are skipped at that length, with a
  note.
* Causal rows: ``rfa`` and ``rfa_gate`` (Peng et al. 2021), for the gate's cost.
* Forward + backward of ``out`` against a fixed random gradient, and the forward alone under
  ``torch.no_grad()``: the median over interleaved rounds of the median of the calls in each
  round; the peak memory of one call (PyTorch profiler allocation records; inputs excluded).

Results go to ``benchmarks/results/baselines-<machine>-torch<version>-kattn<version>.{json,md}``.

    python benchmarks/baselines_speed.py --peer-site DIR --peer-site DIR2   # the committed run
    python benchmarks/baselines_speed.py --quick                          # a smoke run

(DIR, DIR2: the site-packages of scratch venvs with ``pip install reformer-pytorch`` and
``pip install sinkhorn-transformer``, outside the repository.)

The script re-runs itself under glibc settings that keep freed memory (``--malloc steady``,
the default; :data:`STEADY_MALLOC`), so that no row's time depends on how much memory the rows
before it left mapped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

import kattn
from baselines_speed_report import REFORMER_MATCHED, REFORMER_PEER, render, targets
from kattn.bench import machine_info, peak_memory_bytes
from kattn.bench.script_results import write_run
from kattn.functional import reformer_num_buckets
from sparse_speed import Dense, forward_fn, inputs, timed_rounds, train_fn
from sparse_speed_report import SDPA, dense_fits, score_bytes

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D = 1, 4, 64
NON_CAUSAL = ("reformer", "smyrf", "clustered", "improved_clustered", "sinkhorn", "synthesizer",
              "informer")  # fmt: skip
CAUSAL = ("rfa", "rfa_gate")
#: rows whose time grows with (L, L) scores (SDPA: the fused kernel never stores them) and
#: rows that store them, each run only where the scores fit under its cap
QUADRATIC = {SDPA: "memory_cap_gb", "synthesizer": "stored_cap_gb"}
SINKHORN_PEER = "sinkhorn-transformer"


class _Causal(torch.nn.Module):
    """A mechanism called with ``causal=True``."""

    def __init__(self, attn: torch.nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, q, k, v):
        return self.attn(q, k, v, causal=True)


class _ReformerPeer(torch.nn.Module):
    """reformer-pytorch's LSH attention on (B·H, L, D) with shared query/keys (k is not read,
    as in kattn's ``reformer`` default)."""

    def __init__(self) -> None:
        super().__init__()
        from reformer_pytorch import LSHAttention

        self.lsh = LSHAttention(bucket_size=64, n_hashes=2).eval()

    def forward(self, q, k, v):
        b, h, n, d = q.shape
        return self.lsh(q.reshape(b * h, n, d), v.reshape(b * h, n, d))[0].view(b, h, n, d)


class _SinkhornPeer(torch.nn.Module):
    """sinkhorn-transformer's ``SinkhornAttention`` on (B, H, L, D), block 64."""

    def __init__(self, length: int) -> None:
        super().__init__()
        for name, attrs in {  # modules the package imports for other layers than this one
            "local_attention": ["LocalAttention"],
            "axial_positional_embedding": ["AxialPositionalEmbedding"],
            "product_key_memory": ["PKM"],
        }.items():
            try:
                __import__(name)
            except ImportError:
                stub = types.ModuleType(name)
                for attr in attrs:
                    setattr(stub, attr, object)
                sys.modules[name] = stub
        from sinkhorn_transformer.sinkhorn_transformer import SinkhornAttention

        self.attn = SinkhornAttention(64, H * D, D, H, max_seq_len=length).eval()

    def forward(self, q, k, v):
        return self.attn(q, k, v)


def peers(notes: list[str]) -> list[str]:
    """The peer rows that can be built here."""
    found = []
    for name, make in ((REFORMER_PEER, _ReformerPeer), (SINKHORN_PEER, lambda: _SinkhornPeer(64))):
        try:
            make()
            found.append(name)
        except ImportError as error:
            notes.append(f"`{name}` not run: {error} (pass its site-packages with --peer-site).")
    return found


def build(row: str, length: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if row == SDPA:
        return Dense()
    if row == REFORMER_PEER:
        return _ReformerPeer()
    if row == SINKHORN_PEER:
        return _SinkhornPeer(length)
    if row == REFORMER_MATCHED:
        buckets = reformer_num_buckets(length, 2 * 64)  # the peer's L/m for m = 64
        return kattn.build("reformer", head_dim=D, num_heads=H, num_buckets=buckets).eval()
    name = row.removesuffix(" causal")
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=length).eval()
    return _Causal(attn) if row.endswith(" causal") else attn


def rows_at(length: int, rows: list[str], args, notes: list[str]) -> list[str]:
    """The rows run at ``length``: the quadratic ones only where their scores fit their cap."""
    kept = []
    for row in rows:
        cap = getattr(args, QUADRATIC[row]) if row in QUADRATIC else None
        if cap is None or dense_fits(length, B, H, cap * 2**30):
            kept.append(row)
            continue
        gib = score_bytes(length, B, H) / 2**30
        notes.append(
            f"L={length}: `{row}` skipped, its (B, H, L, L) fp32 scores ({gib:.0f} GiB) exceed "
            f"the {cap:g} GiB cap (--{QUADRATIC[row].replace('_', '-')})."
        )
    return kept


def measure_length(length: int, rows: list[str], args, notes: list[str]) -> dict:
    q, k, v, grad = inputs(length)
    modules = {row: build(row, length) for row in rows_at(length, rows, args, notes)}
    fwd = {row: forward_fn(m, q, k, v) for row, m in modules.items()}
    train = {row: train_fn(m, q, k, v, grad) for row, m in modules.items()}
    fwd_mem = {row: peak_memory_bytes(fn) for row, fn in fwd.items()}  # also warms up
    train_mem = {row: peak_memory_bytes(fn) for row, fn in train.items()}
    rounds = args.rounds if length <= 4096 else args.long_rounds
    f = timed_rounds(fwd, rounds, args.seconds, f"L={length} forward")
    t = timed_rounds(train, rounds, args.seconds, f"L={length} forward+backward")
    return {"forward": f, "train": t, "forward_memory": fwd_mem, "train_memory": train_mem}


def check_correctness(rows: list[str], length: int) -> dict[str, float]:
    """Max abs difference of each kattn row's fast path from its dense reference
    (``Attention.reference``), both in float64 and in eval mode, at a short length: what the
    paths compute, not fp32 rounding (which random-feature normalisers near zero amplify)."""
    q, k, v = (x.double() for x in inputs(length, seed=1)[:3])
    found = {}
    for row in rows:
        if row in (SDPA, REFORMER_PEER, SINKHORN_PEER):
            continue
        attn = build(row.removesuffix(" causal"), length).double()
        causal = row.endswith(" causal")
        with torch.no_grad():
            out = attn(q, k, v, causal=causal)
            ref = attn.reference(q, k, v, causal=causal)
        found[row] = float((out - ref).abs().max())
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, L ≤ 4096")
    parser.add_argument("--long-rounds", type=int, default=3, help="rounds for L > 4096")
    parser.add_argument("--seconds", type=float, default=0.3, help="per candidate per round")
    parser.add_argument("--memory-cap-gb", type=float, default=4.0,
                        help="run SDPA only where its L×L fp32 scores fit (its time grows with "
                        "them; the fused kernel never stores them)")  # fmt: skip
    parser.add_argument("--stored-cap-gb", type=float, default=2.0,
                        help="run synthesizer, which stores L×L scores (more for backward), "
                        "only where they fit")  # fmt: skip
    parser.add_argument("--peer-site", action="append", default=[], type=Path,
                        help="a site-packages folder with a peer package (repeatable)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own, one per core)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="short lengths, 2 short rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--malloc", choices=("steady", "default"), default="steady",
        help="steady: run under glibc settings that keep freed memory (no mmap per large "
        "block, no trimming), so that no row pays page faults another row's allocations "
        "would have spared it; default: the process's own",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.long_rounds, args.seconds = "256,512", 2, 2, 0.02
    args.lengths = [int(x) for x in args.lengths.split(",")]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sys.path.extend(str(p) for p in args.peer_site)
    return args


#: glibc settings under which freed memory stays with the process: every block comes from the
#: heap (no mmap of large blocks, whose pages fault afresh at each allocation) and the heap is
#: never trimmed. Without them a row's time depends on the rows run before it (reformer-pytorch's
#: most, whose large blocks fault in afresh at every call unless earlier rows grew the heap).
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}


def pin_allocator(mode: str) -> None:
    """Re-run this process with :data:`STEADY_MALLOC` in its environment unless it has them
    (``mode="steady"``; other C libraries ignore the variables)."""
    if mode == "steady" and any(os.environ.get(k) != v for k, v in STEADY_MALLOC.items()):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **STEADY_MALLOC})


def main() -> None:
    args = parse_args()
    pin_allocator(args.malloc)
    load_start, start = os.getloadavg(), time.perf_counter()
    notes: list[str] = []
    if args.malloc == "steady":
        notes.append(
            "Run with glibc's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set so that freed "
            "memory stays with the process (--malloc steady): otherwise rows whose large blocks "
            "are mapped afresh at every call pay page faults, more or fewer depending on the "
            "rows run before them."
        )
    registered = set(kattn.available())
    missing = [n for n in (*NON_CAUSAL, *CAUSAL) if n not in registered]
    if missing:
        notes.append(f"not registered, not run: {', '.join(missing)}.")
    rows = [SDPA, *(n for n in NON_CAUSAL if n in registered)]
    rows += [REFORMER_MATCHED] if "reformer" in registered else []
    rows += peers(notes)
    rows += [f"{n} causal" for n in CAUSAL if n in registered]
    correctness = check_correctness(rows, min(256, *args.lengths))
    runs = {n: measure_length(n, rows, args, notes) for n in args.lengths}
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "batch": B,
            "heads": H,
            "head_dim": D,
            "value_dim": D,
            "dtype": "float32",
            "rounds": f"{args.rounds} (L ≤ 4096), {args.long_rounds} (longer)",
            "seconds_per_round": args.seconds,
            "memory_cap_gb": args.memory_cap_gb,
            "stored_cap_gb": args.stored_cap_gb,
            "malloc": {"mode": args.malloc, **{k: os.environ.get(k) for k in STEADY_MALLOC}},
        },
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "wall_seconds": time.perf_counter() - start,
        "correctness": correctness,
        "rows": rows,
    }
    for key in ("forward", "train"):
        report[f"{key}_seconds"] = {str(n): r[key][0] for n, r in runs.items()}
        report[f"{key}_round_seconds"] = {str(n): r[key][1] for n, r in runs.items()}
        report[f"{key}_memory"] = {str(n): r[f"{key}_memory"] for n, r in runs.items()}
    report["notes"] = notes
    report["targets"] = targets(report)
    write_run(args.out, "baselines", report, render(report), quick=args.quick)


if __name__ == "__main__":
    main()
