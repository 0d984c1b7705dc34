"""One command for a CUDA machine: the tests that matter there, the causal kernel benchmark and
the speed benchmarks on the GPU, results under ``benchmarks/results/gpu/`` named by the GPU.

1. Tests: ``tests/ops`` runs on CUDA tensors, the Triton kernels compiled for the GPU and not
   interpreted (the test suite sets ``TRITON_INTERPRET`` only without CUDA), among them a
   mechanism-level check that ``backend="auto"`` (the default, which picks the kernels on
   CUDA) equals ``backend="torch"`` in fp32, forward and gradients. The contract and the
   device-placement tests run as on any machine (CPU and ``meta`` tensors): they check that
   the environment is sound, not the GPU.
2. Causal kernelized attention, forward and backward, B=8, H=16, D=64, M=64, bf16, at
   L = 2K/8K/32K: kattn's Triton kernel against ``scaled_dot_product_attention`` (the flash
   backend where PyTorch has it) and, when ``fla`` is importable, FLA's ``chunk_linear_attn``
   on the same features (``elu + 1`` of the queries and keys, normalised; the feature map is
   outside the timing); beside them kattn's PyTorch chunked path and the relative-position
   kernels (decaying with 3 terms, T5 buckets, and exact Toeplitz up to 8K). Each output is
   checked first against its PyTorch path in fp32 (``linear_attention_chunked``,
   ``decay_linear_attention``, ``banded_linear_attention``, the blocked Toeplitz path): a
   largest absolute error over :data:`TOLERANCE` (bf16 outputs) fails the check; then median
   time (CUDA events) and peak memory. A row that raises records the error and fails the
   check; the results are written whatever happens.
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
#: largest absolute error of a bf16 output against its PyTorch path in fp32 that passes
TOLERANCE = 2e-2


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


def candidates(rpe: dict[str, Callable[..., Any]], flash: Any) -> dict[str, Callable[..., Any]]:
    """Name → ``fn(q, k, v, fq, fk)`` of each causal attention compared (``rpe``: the
    positional coefficients, :func:`rpe_inputs`)."""
    import torch.nn.functional as F

    from kattn.functional import linear_attention_chunked
    from kattn.ops.triton.banded import banded_linear_attention_triton
    from kattn.ops.triton.causal_linear import causal_linear_attention_triton
    from kattn.ops.triton.decay import decay_linear_attention_triton
    from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton

    def sdpa(q, k, v, fq, fk):
        with flash():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def decay_rpe(q, k, v, fq, fk):
        log_alpha, log_gamma = rpe["decay"]()
        return decay_linear_attention_triton(fq, fk, v, log_alpha, log_gamma, causal=True)

    def bucketed_rpe(q, k, v, fq, fk):
        log_coeff, left = rpe["bucketed"]()
        return banded_linear_attention_triton(fq, fk, v, log_coeff, left, causal=True)

    def toeplitz_rpe(q, k, v, fq, fk):
        log_coeff = rpe["toeplitz"](q.shape[2])
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


def rpe_inputs(device: str, heads: int) -> dict[str, Callable[..., Any]]:
    """The positional coefficients of the relative-position candidates: T5's 32 buckets up to
    128 and a decay of 3 terms (the modules' initial values), and a zero Toeplitz table."""
    import torch

    from kattn.positional.bucketed import BucketedBias
    from kattn.positional.decay import DecayBias

    decay = DecayBias(num_heads=heads).to(device)
    buckets = BucketedBias(num_heads=heads).to(device)
    return {
        "decay": lambda: (decay.log_alpha, decay.log_gamma()),
        "bucketed": lambda: (buckets.band_log_coefficients(), buckets.left),
        "toeplitz": lambda length: torch.zeros(heads, 2 * length - 1, device=device),
    }


def references(rpe: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Name → ``reference(fq, fk, v)``: each kattn candidate's PyTorch path (run in fp32), with
    the candidates' positional coefficients ``rpe``."""
    from kattn.functional import (
        banded_linear_attention,
        decay_linear_attention,
        linear_attention_chunked,
    )
    from kattn.ops.triton.toeplitz_blocked import _toeplitz_reference

    def decay(fq, fk, v):
        log_alpha, log_gamma = (x.detach().float() for x in rpe["decay"]())
        return decay_linear_attention(fq, fk, v, log_alpha, log_gamma, causal=True)

    def bucketed(fq, fk, v):
        log_coeff, left = rpe["bucketed"]()
        return banded_linear_attention(fq, fk, v, log_coeff.detach().float(), left, causal=True)

    def toeplitz(fq, fk, v):
        return _toeplitz_reference(fq, fk, v, rpe["toeplitz"](fq.shape[2]), causal=True)

    linear = lambda fq, fk, v: linear_attention_chunked(fq, fk, v)  # noqa: E731
    return {
        "kattn triton": linear,
        "kattn torch (chunked)": linear,
        "fla chunk_linear_attn": linear,
        "kattn triton decay rpe (R=3)": decay,
        "kattn triton bucketed rpe (32/128)": bucketed,
        "kattn triton toeplitz rpe (exact)": toeplitz,
    }


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
    import torch.nn.functional as F

    dtype = torch.bfloat16
    b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
    rpe = rpe_inputs(device, h)  # one set of coefficients for the kernels and their references
    fns = candidates(rpe, flash_context() if device == "cuda" else _null_context)
    refs = references(rpe)
    rows = []
    for length in shape["lengths"]:
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(b, h, length, d, generator=g).to(device, dtype) for _ in range(3))
        q, k = q * d**-0.25, k * d**-0.25
        fq, fk = F.elu(q) + 1.0, F.elu(k) + 1.0  # positive features, M = D
        grad = torch.randn(b, h, length, d, generator=g).to(device, dtype)
        for name, fn in fns.items():
            if "toeplitz" in name and length > max(TOEPLITZ_MAX_LENGTH, shape["lengths"][0]):
                rows.append({"length": length, "name": name, "skipped": "O(L²): over 8K"})
                continue
            row = checked_row(name, fn, refs.get(name), (q, k, v, fq, fk), grad, repeats, device)
            rows.append({"length": length, **row})
            print(f"gpu_check: L={length} {name}: {rows[-1]}", file=sys.stderr, flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def checked_row(
    name: str,
    fn: Callable[..., Any],
    reference: Callable[..., Any] | None,
    inputs: tuple[Any, ...],
    grad: Any,
    repeats: int,
    device: str,
) -> dict[str, Any]:
    """One candidate at one length: its error against ``reference`` (fp32 inputs), whether
    it is finite and within :data:`TOLERANCE`, its time and peak memory; an exception is
    recorded as ``error`` (out of memory as ``skipped``)."""
    import torch

    from kattn.bench.timing import measure_time, peak_memory_bytes

    q, k, v, fq, fk = inputs
    leaves = [x.detach().requires_grad_() for x in inputs]

    def step() -> None:
        fn(*leaves).backward(grad)

    row: dict[str, Any] = {"name": name}
    try:
        with torch.no_grad():
            out = fn(q, k, v, fq, fk).float()
            if reference is not None:
                want = reference(fq.float(), fk.float(), v.float())
                row["max_abs_error"] = float((out - want).abs().max())
                row["within_tolerance"] = row["max_abs_error"] <= TOLERANCE
        row["finite"] = bool(torch.isfinite(out).all())
        timing = measure_time(step, repeats=repeats, warmup=min(1, repeats - 1), device=device)
        row["seconds"] = timing.median
        row["peak_bytes"] = peak_memory_bytes(step, device=device)
    except torch.cuda.OutOfMemoryError:
        row["skipped"] = "out of memory"
    except Exception as error:
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
    return row


def row_failures(rows: list[dict[str, Any]]) -> list[str]:
    """The rows that failed: raised, not finite, or over the tolerance."""
    return [
        f"{r['name']} L={r['length']}"
        for r in rows
        if "error" in r or r.get("finite") is False or r.get("within_tolerance") is False
    ]


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
        f"| L | candidate | ms | peak MiB | max abs error vs PyTorch (tolerance {TOLERANCE}) |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in report["kernels"]:
        ms = f"{r['seconds'] * 1e3:.2f}" if "seconds" in r else r.get("skipped", "—")
        mib = f"{r['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in r else "—"
        err = f"{r['max_abs_error']:.2e}" if "max_abs_error" in r else "—"
        if "error" in r:
            ms, err = "ERROR", r["error"].splitlines()[0][:120].replace("|", "/")
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
    report: dict[str, Any] = {
        "machine": info,
        "shape": {k: v for k, v in shape.items() if k != "lengths"},
        "dtype": "bfloat16",
        "tolerance": TOLERANCE,
        "dry_run": args.dry_run,
        "kernels": [],
        "ratios": [],
        "commands": commands,
    }
    try:
        report["kernels"] = kernel_benchmark(device, shape, 1 if args.dry_run else args.repeats)
        report["ratios"] = ratios(report["kernels"])
        if not args.skip_benchmarks:
            commands += [run_command(n, c, env) for n, c in benchmark_commands(out, args.dry_run)]
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"[:2000]
    write_results(args.out, stem, report, render(report))
    print(json.dumps(report["ratios"]), flush=True)
    failed = [c["name"] for c in commands if c["returncode"] != 0]
    failed += row_failures(report["kernels"])
    failed += ["the benchmark itself: " + report["error"]] if "error" in report else []
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
