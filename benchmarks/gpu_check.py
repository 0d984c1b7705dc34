"""One command for a CUDA machine: the tests that matter there, the causal kernel benchmark and
the speed benchmarks on the GPU, results under ``benchmarks/results/gpu/`` named by the GPU.

1. Tests: ``tests/ops`` (the Triton kernels compiled for the GPU, not interpreted: the test
   suite sets ``TRITON_INTERPRET`` only without CUDA), the contract and the device-placement
   tests.
2. Causal kernelized attention, forward and backward, B=8, H=16, D=64, M=64, bf16, at
   L = 2K/8K/32K: kattn's Triton kernel against ``scaled_dot_product_attention`` (the flash
   backend where PyTorch has it) and, when ``fla`` is importable, FLA's ``chunk_linear_attn``
   on the same features (``elu + 1`` of the queries and keys, normalised; the feature map is
   outside the timing); beside them kattn's PyTorch chunked path and the relative-position
   kernels (decaying with 3 terms, T5 buckets, and exact Toeplitz up to 8K). Each output is
   checked against the PyTorch reference first; median time (CUDA events) and peak memory.
3. ``kattn bench speed --device cuda`` (causal, forward and backward, bf16) and
   ``benchmarks/lm_speed.py --device cuda``.

Without CUDA it says so and exits with status 2; ``--dry-run`` runs a tiny version on the CPU
instead (kernels in Triton's interpreter at one short length, the test runs only listed, the
benchmark commands asked for ``--help``), so that every code path runs in the test suite.

    python benchmarks/gpu_check.py             # on a CUDA machine
    python benchmarks/gpu_check.py --dry-run   # a smoke run anywhere, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
TEST_PATHS = ("tests/ops", "tests/test_contract.py", "tests/test_device_placement.py")
FULL = {"batch": 8, "heads": 16, "head_dim": 64, "features": 64, "lengths": (2048, 8192, 32768)}
TINY = {"batch": 1, "heads": 2, "head_dim": 16, "features": 16, "lengths": (48,)}
#: the exact Toeplitz kernel is O(L²): timed up to this length
TOEPLITZ_MAX_LENGTH = 8192


def run_command(name: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``command`` from the repository root; its status and the end of its output."""
    print(f"gpu_check: {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    tail = (done.stdout + done.stderr)[-3000:]
    print(tail, file=sys.stderr, flush=True)
    return {"name": name, "command": command, "returncode": done.returncode, "tail": tail}


def test_commands() -> list[tuple[str, list[str]]]:
    """The pytest runs of part 1."""
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return [("tests: " + path, [*base, path]) for path in TEST_PATHS]


def paths_exist(name: str, command: list[str]) -> dict[str, Any]:
    """A dry run's stand-in for :func:`run_command` on a test run: are its paths there?"""
    missing = [p for p in command if p.startswith("tests") and not (ROOT / p).exists()]
    tail = f"dry run: not run; missing: {missing}" if missing else "dry run: not run"
    return {"name": name, "command": command, "returncode": 1 if missing else 0, "tail": tail}


def benchmark_commands(out: Path, dry_run: bool) -> list[tuple[str, list[str]]]:
    """The commands of part 3 (asked for ``--help`` in a dry run)."""
    kattn = [sys.executable, "-m", "kattn"]
    speed = [*kattn, "bench", "speed", "--device", "cuda", "--causal", "--pass", "both",
             "--dtype", "bfloat16", "--lengths", "1024,4096,16384",
             "--out", str(out / "speed")]  # fmt: skip
    lm = [sys.executable, str(ROOT / "benchmarks" / "lm_speed.py"), "--device", "cuda",
          "--out", str(out)]  # fmt: skip
    if dry_run:
        speed, lm = [*kattn, "bench", "speed", "--help"], [lm[0], lm[1], "--help"]
    return [("kattn bench speed", speed), ("lm_speed", lm)]


def elu_features(x: Any) -> Any:
    """``elu(x) + 1``: positive features of the same size (M = D)."""
    import torch.nn.functional as F

    return F.elu(x) + 1.0


def candidates(device: str, heads: int, flash: Any) -> dict[str, Callable[..., Any]]:
    """Name → ``fn(q, k, v, fq, fk)`` of each causal attention compared."""
    import torch
    import torch.nn.functional as F

    from kattn.functional import linear_attention_chunked
    from kattn.ops.triton.banded import banded_linear_attention_triton
    from kattn.ops.triton.causal_linear import causal_linear_attention_triton
    from kattn.ops.triton.decay import decay_linear_attention_triton
    from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton
    from kattn.positional.bucketed import BucketedBias
    from kattn.positional.decay import DecayBias

    decay = DecayBias(num_heads=heads).to(device)  # its initial rates: 3 terms
    buckets = BucketedBias(num_heads=heads).to(device)  # T5's 32 buckets up to 128

    def sdpa(q, k, v, fq, fk):
        with flash():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def decay_rpe(q, k, v, fq, fk):
        log_alpha, log_gamma = decay.log_alpha, decay.log_gamma()
        return decay_linear_attention_triton(fq, fk, v, log_alpha, log_gamma, causal=True)

    def bucketed_rpe(q, k, v, fq, fk):
        log_coeff = buckets.band_log_coefficients()
        return banded_linear_attention_triton(fq, fk, v, log_coeff, buckets.left, causal=True)

    def toeplitz_rpe(q, k, v, fq, fk):
        log_coeff = fq.new_zeros(heads, 2 * q.shape[2] - 1, dtype=torch.float32)
        return toeplitz_linear_attention_triton(fq, fk, v, log_coeff, causal=True)

    found = {
        "kattn triton": lambda q, k, v, fq, fk: causal_linear_attention_triton(fq, fk, v),
        "sdpa": sdpa,
        "kattn torch (chunked)": lambda q, k, v, fq, fk: linear_attention_chunked(fq, fk, v),
        "kattn triton decay rpe (R=3)": decay_rpe,
        "kattn triton bucketed rpe (32/128)": bucketed_rpe,
        "kattn triton toeplitz rpe (exact)": toeplitz_rpe,
    }
    fla = fla_linear_attention()
    if fla is not None:
        found["fla chunk_linear_attn"] = fla
    return found


def fla_linear_attention() -> Callable[..., Any] | None:
    """FLA's ``chunk_linear_attn`` on ``(B, H, L, M)`` features (normalised, scale 1), or None
    when ``fla`` is not importable."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError:
        return None
    import inspect

    takes_layout = "head_first" in inspect.signature(chunk_linear_attn).parameters

    def run(q, k, v, fq, fk):
        args = [x.transpose(1, 2) for x in (fq, fk, v)]  # FLA's (B, L, H, ·)
        layout = {"head_first": False} if takes_layout else {}
        out, _ = chunk_linear_attn(*args, scale=1.0, normalize=True, **layout)
        return out.transpose(1, 2)

    return run


def flash_context() -> Any:
    """A context that restricts SDPA to the flash backend where PyTorch has that switch."""
    import contextlib

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - older PyTorch
        return contextlib.nullcontext
    return lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def kernel_benchmark(device: str, shape: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    """Part 2: every candidate at every length, checked, timed and measured."""
    import torch

    from kattn.bench.timing import measure_time, peak_memory_bytes
    from kattn.functional import linear_attention_chunked

    dtype = torch.bfloat16
    b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
    fns = candidates(device, h, flash_context() if device == "cuda" else _null_context)
    rows = []
    for length in shape["lengths"]:
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(b, h, length, d, generator=g).to(device, dtype) for _ in range(3))
        q, k = q * d**-0.25, k * d**-0.25
        fq, fk = elu_features(q), elu_features(k)
        grad = torch.randn(b, h, length, d, generator=g).to(device, dtype)
        reference = None
        for name, fn in fns.items():
            if "toeplitz" in name and length > max(TOEPLITZ_MAX_LENGTH, shape["lengths"][0]):
                rows.append({"length": length, "name": name, "skipped": "O(L²): over 8K"})
                continue
            leaves = [x.detach().requires_grad_() for x in (q, k, v, fq, fk)]

            def step(fn=fn, leaves=leaves, grad=grad) -> None:
                fn(*leaves).backward(grad)

            row: dict[str, Any] = {"length": length, "name": name}
            try:
                with torch.no_grad():
                    out = fn(q, k, v, fq, fk).float()
                if reference is None and "rpe" not in name and name != "sdpa":
                    reference = linear_attention_chunked(fq.float(), fk.float(), v.float())
                if name != "sdpa" and "rpe" not in name and reference is not None:
                    row["max_abs_error"] = float((out - reference).abs().max())
                row["finite"] = bool(torch.isfinite(out).all())
                timing = measure_time(step, repeats=repeats, warmup=min(1, repeats - 1),
                                      device=device)  # fmt: skip
                row["seconds"] = timing.median
                row["peak_bytes"] = peak_memory_bytes(step, device=device)
            except torch.cuda.OutOfMemoryError:
                row["skipped"] = "out of memory"
            rows.append(row)
            print(f"gpu_check: L={length} {name}: {row}", file=sys.stderr, flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def _null_context() -> Any:
    import contextlib

    return contextlib.nullcontext()


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per length: SDPA's time over kattn triton's, and kattn triton's over FLA's."""
    out = []
    for length in sorted({r["length"] for r in rows}):
        t = {r["name"]: r.get("seconds") for r in rows if r["length"] == length}
        ours = t.get("kattn triton")
        entry: dict[str, Any] = {"length": length}
        if ours and t.get("sdpa"):
            entry["sdpa_over_kattn"] = t["sdpa"] / ours
        if ours and t.get("fla chunk_linear_attn"):
            entry["kattn_over_fla"] = ours / t["fla chunk_linear_attn"]
        out.append(entry)
    return out


def render(report: dict[str, Any]) -> str:
    """The markdown table of part 2 and the status of parts 1 and 3."""
    lines = [
        f"# GPU check on {report['machine'].get('gpu', report['machine']['processor'])}",
        "",
        f"Causal, forward + backward, {report['shape']}, bf16; features elu + 1 (M = D).",
        "",
        "| L | candidate | ms | peak MiB | max abs error vs PyTorch |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in report["kernels"]:
        ms = f"{r['seconds'] * 1e3:.2f}" if "seconds" in r else r.get("skipped", "—")
        mib = f"{r['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in r else "—"
        err = f"{r['max_abs_error']:.2e}" if "max_abs_error" in r else "—"
        lines.append(f"| {r['length']} | {r['name']} | {ms} | {mib} | {err} |")
    lines += ["", "| L | SDPA / kattn triton | kattn triton / FLA |", "|---:|---:|---:|"]
    for r in report["ratios"]:
        a, b = r.get("sdpa_over_kattn"), r.get("kattn_over_fla")
        lines.append(f"| {r['length']} | {a:.2f} |" if a else f"| {r['length']} | — |")
        lines[-1] += f" {b:.2f} |" if b else " — |"
    lines += ["", "| step | status |", "|---|---|"]
    for c in report["commands"]:
        lines.append(f"| {c['name']} | {'ok' if c['returncode'] == 0 else 'FAILED'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny CPU run in Triton's interpreter (no CUDA needed)")  # fmt: skip
    parser.add_argument("--skip-tests", action="store_true", help="no part 1")
    parser.add_argument("--skip-benchmarks", action="store_true", help="no part 3")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per candidate")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = env["TRITON_INTERPRET"] = "1"  # before triton loads
    else:
        env.pop("TRITON_INTERPRET", None)  # the tests must compile the kernels for the GPU
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine: nothing to check (run it on "
              "a GPU, or pass --dry-run for a tiny CPU run)", file=sys.stderr)  # fmt: skip
        return 2
    from kattn.bench import machine_info, results_stem, write_results

    device = "cpu" if args.dry_run else "cuda"
    info = machine_info(device)
    stem = results_stem("gpu-check", info, device) + ("-dry-run" if args.dry_run else "")
    out = args.out / stem
    commands = []
    if not args.skip_tests:
        check = paths_exist if args.dry_run else lambda n, c: run_command(n, c, env)
        commands += [check(n, c) for n, c in test_commands()]
    shape = TINY if args.dry_run else FULL
    rows = kernel_benchmark(device, shape, 1 if args.dry_run else args.repeats)
    if not args.skip_benchmarks:
        commands += [run_command(n, c, env) for n, c in benchmark_commands(out, args.dry_run)]
    report = {
        "machine": info,
        "shape": {k: v for k, v in shape.items() if k != "lengths"},
        "dtype": "bfloat16",
        "dry_run": args.dry_run,
        "kernels": rows,
        "ratios": ratios(rows),
        "commands": commands,
    }
    write_results(args.out, stem, report, render(report))
    print(json.dumps(report["ratios"]), flush=True)
    failed = [c["name"] for c in commands if c["returncode"] != 0]
    failed += [f"{r['name']} L={r['length']}" for r in rows if r.get("finite") is False]
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
