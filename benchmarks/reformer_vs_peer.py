"""kattn's ``reformer`` against reformer-pytorch's ``LSHAttention`` and dense SDPA on the CPU.

Forward + backward of B = 1, H = 4, D = 64 in fp32, the same ``bucket_size`` and number of
hash rounds for both LSH implementations; time as the median over interleaved rounds (each
candidate runs in every round, so machine noise hits all alike), peak memory of one call from
the PyTorch profiler's allocation records (:func:`kattn.bench.peak_memory_bytes`).

Before timing, an agreement check: kattn's :func:`~kattn.functional.reformer_attention` is
given the rotations reformer-pytorch draws (its ``L/bucket_size`` buckets) and compared with
``LSHAttention(allow_duplicate_attention=False)`` on the queries whose chunks never wrap
(reformer-pytorch's first chunk of a round looks back into the previous round's last chunk;
kattn's reads only itself): they must agree to rounding. The difference with the peer's
default (duplicates counted per round) is reported too.

reformer-pytorch is not a kattn dependency: install it in a scratch environment and pass its
site-packages, e.g.

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install reformer-pytorch
    .venv/bin/python benchmarks/reformer_vs_peer.py \
        --peer-site /tmp/peers/lib/python3.11/site-packages --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import kattn
from kattn.bench import measure_time, peak_memory_bytes
from kattn.functional.reformer import reformer_attention

B, H, D = 1, 4, 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="4096,16384", help="comma-separated L")
    parser.add_argument("--bucket-size", type=int, default=64)
    parser.add_argument("--num-hashes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--calls", type=int, default=1, help="calls per candidate per round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--no-sdpa", action="store_true", help="skip dense SDPA")
    parser.add_argument("--peer-site", default=None, help="site-packages with reformer_pytorch")
    return parser.parse_args()


def peer_lsh(args: argparse.Namespace, **options: Any) -> Any:
    if args.peer_site:
        sys.path.append(args.peer_site)
    from reformer_pytorch import LSHAttention

    return LSHAttention(bucket_size=args.bucket_size, n_hashes=args.num_hashes, **options).eval()


def agreement(args: argparse.Namespace, length: int = 1024) -> dict[str, float]:
    """Max |kattn − peer| on the queries outside every round's first chunk, with the peer's
    duplicate correction on (must be rounding) and off (its default)."""
    g = torch.Generator().manual_seed(0)
    q, v = (torch.randn(B, H, length, D, generator=g, dtype=torch.float64) for _ in range(2))
    m, rounds = args.bucket_size, args.num_hashes
    result = {}
    for dedupe in (True, False):
        peer = peer_lsh(args, allow_duplicate_attention=not dedupe)
        torch.manual_seed(1)
        out_peer, _, buckets = peer(q.view(B * H, length, D), v.view(B * H, length, D))
        torch.manual_seed(1)  # the same draw as the peer's hash_vectors
        rotations = torch.randn(1, D, rounds, length // m // 2, dtype=torch.float64)
        out = reformer_attention(q, q, v, rotations, bucket_size=m).view(B * H, length, D)
        nb = length // m
        hashes = buckets.view(B * H, rounds, length) - torch.arange(rounds)[:, None] * nb
        # sorted slot of each position per round < m  ⇔  in the round's first chunk
        rank = (hashes * length + torch.arange(length)).argsort(-1).argsort(-1)
        inner = (rank >= m).all(dim=1)  # (B·H, L)
        diff = (out - out_peer).abs().amax(dim=-1)[inner]
        result["dedupe" if dedupe else "peer_default"] = float(diff.max())
        result["queries_compared"] = float(inner.float().mean())
    return result


def train_call(fn: Callable[..., torch.Tensor], grad: torch.Tensor, *xs: torch.Tensor):
    xs = tuple(x.detach().requires_grad_() for x in xs)

    def run() -> None:
        for x in xs:
            x.grad = None
        fn(*xs).backward(grad)

    return run


def candidates(args: argparse.Namespace, length: int) -> dict[str, Callable[[], None]]:
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(B, H, length, D, generator=g) for _ in range(4))
    ours = kattn.build(
        "reformer",
        head_dim=D,
        num_heads=H,
        bucket_size=args.bucket_size,
        num_hashes=args.num_hashes,
    ).eval()
    peer = peer_lsh(args)

    def peer_fn(qk: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
        return peer(qk.view(B * H, length, D), val.view(B * H, length, D))[0]

    fns = {
        "kattn reformer": train_call(lambda a, b, c: ours(a, b, c), grad, q, k, v),
        "reformer-pytorch": train_call(peer_fn, grad.view(B * H, length, D), q, v),
    }
    if not args.no_sdpa:
        fns["sdpa"] = train_call(F.scaled_dot_product_attention, grad, q, k, v)
    return fns


def measure(args: argparse.Namespace, length: int) -> None:
    fns = candidates(args, length)
    memory = {name: peak_memory_bytes(fn) for name, fn in fns.items()}  # also warms up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            times[name].append(measure_time(fn, repeats=args.calls, warmup=0).median)
        print(
            f"L={length} round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()),
            flush=True,
        )
    med = {name: statistics.median(t) for name, t in times.items()}
    ours = "kattn reformer"
    print(f"\nL = {length}, fwd+bwd, B={B} H={H} D={D} fp32, threads {torch.get_num_threads()}")
    print("| candidate | median s | × kattn time | peak MiB | × kattn memory |")
    print("|---|---:|---:|---:|---:|")
    for name in fns:
        print(
            f"| {name} | {med[name]:.3f} | {med[name] / med[ours]:.2f} | "
            f"{memory[name] / 2**20:.0f} | {memory[name] / memory[ours]:.2f} |"
        )
    print(flush=True)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    check = agreement(args)
    print(
        "agreement with reformer-pytorch on its rotations, max |Δ| over "
        f"{check['queries_compared']:.0%} of the queries: {check['dedupe']:.2e} with its "
        f"duplicate correction on, {check['peer_default']:.2e} with its default (off)",
        flush=True,
    )
    if check["dedupe"] > 1e-6:
        raise SystemExit("kattn and reformer-pytorch disagree on identical rotations")
    for length in (int(x) for x in args.lengths.split(",")):
        measure(args, length)


if __name__ == "__main__":
    main()
