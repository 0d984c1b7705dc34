"""Every Triton kernel, launched as the library launches it at the largest sizes the dispatch
holds it to (fp32 and bf16: the mechanisms' largest default shapes, M = 256 features and
Dv = 128 value columns; fp64: M = 32, Dv = 64) with chunks of 64, fits the shared memory of
an A100 (sm_80) and of an H100 (sm_90), and the scanning kernels' products with bf16 inputs
are tensor-core products.

The launches are recorded while the kernels run in Triton's interpreter on a few tokens, then
compiled ahead of time for both targets in a process without the interpreter
(``tests/ops/aot_compile.py``); no GPU is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kattn.functional.linear_causal import LinearState  # noqa: E402
from kattn.functional.numerics import accumulation_dtype  # noqa: E402
from kattn.ops.triton.banded import banded_linear_attention_triton  # noqa: E402
from kattn.ops.triton.causal_linear import (  # noqa: E402
    causal_linear_attention_triton,
    causal_linear_prefill_triton,
)
from kattn.ops.triton.decay import decay_linear_attention_triton  # noqa: E402
from kattn.ops.triton.linear_step import linear_step_triton  # noqa: E402
from kattn.ops.triton.noncausal_linear import linear_attention_triton  # noqa: E402
from kattn.ops.triton.placement import interpreted  # noqa: E402
from kattn.ops.triton.sizes import checked_sizes  # noqa: E402
from kattn.ops.triton.toeplitz_blocked import toeplitz_linear_attention_triton  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreted(), reason="records launches in the interpreter")

#: bytes of shared memory one block may use (CUDA programming guide, compute capabilities).
LIMITS = {80: 166_912, 90: 232_448}
CHUNK, LENGTH = 64, 8
#: the kernels that scan a sequence (their products on tensor cores for half inputs); the
#: non-causal kernels holding a whole 256 × 128 state use IEEE products there.
SCANS = {
    "kattn.ops.triton.causal_linear:_causal_linear_forward",
    "kattn.ops.triton.linear_backward:_causal_dq",
    "kattn.ops.triton.linear_backward:_causal_dkv",
    "kattn.ops.triton.noncausal_linear:_weighted_sums",
    "kattn.ops.triton.decay:_decayed_causal_sums",
    "kattn.ops.triton.rpe_window:_rpe_window_sums",
    "kattn.ops.triton.rpe_window_backward:_window_dq",
    "kattn.ops.triton.rpe_window_backward:_window_dkv",
}
_SCRIPT = Path(__file__).with_name("aot_compile.py")


def _describe(value: object) -> list:
    """A launch argument as the compile script reads it."""
    if isinstance(value, torch.Tensor):
        return ["ptr", str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return ["const", value]
    if isinstance(value, int):
        return ["i32", value]
    if isinstance(value, float):
        return ["fp32", value]
    if isinstance(value, triton.language.dtype):
        return ["const", ["dtype", str(value)]]
    return ["const", value]


def _recorded(run: Callable[[], object]) -> list[dict]:
    """The kernel launches ``run`` makes in the interpreter, one per kernel and constants."""
    launches: dict[str, dict] = {}
    original = interpreter.InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
        fn = self.fn
        names = list(self.arg_names)
        values = dict(zip(names, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in names})
        described = {k: _describe(v) for k, v in values.items()}
        launch = {
            "kernel": f"{fn.__module__}:{fn.__name__}",
            "args": described,
            "num_stages": kwargs.get("num_stages", 3),
        }
        shape = {k: v for k, v in described.items() if v[0] in ("ptr", "const")}
        launches[json.dumps([launch["kernel"], shape, launch["num_stages"]])] = launch
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = record
    try:
        run()
    finally:
        interpreter.InterpretedFunction.run = original
    return list(launches.values())


def _inputs(dtype: torch.dtype, m: int, dv: int) -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    yield (torch.rand(1, 2, LENGTH, m, generator=g) + 0.05).to(dtype).requires_grad_()
    yield (torch.rand(1, 2, LENGTH, m, generator=g) + 0.05).to(dtype).requires_grad_()
    yield torch.randn(1, 2, LENGTH, dv, generator=g).to(dtype).requires_grad_()
    yield torch.randn(1, 2, LENGTH, generator=g).requires_grad_()


def _run_every_kernel(dtype: torch.dtype) -> None:
    """Forward and backward of every kernel-backed operation at the checked sizes of
    ``dtype`` (:func:`~kattn.ops.triton.sizes.checked_sizes`)."""
    m, dv = checked_sizes(dtype)
    fq, fk, v, s = _inputs(dtype, m, dv)
    out = causal_linear_attention_triton(fq, fk, v, k_log_scale=s, chunk_size=CHUNK)
    out = out + linear_attention_triton(fq, fk, v, k_log_scale=s)
    out.float().sum().backward()
    acc = accumulation_dtype(dtype)
    state = LinearState(*(torch.zeros(1, 2, *shape, dtype=acc) for shape in ((m, dv), (m,), ())))
    with torch.no_grad():
        causal_linear_prefill_triton(fq, fk, v, state, k_log_scale=s, chunk_size=CHUNK)
        one = (x[:, :, :1] for x in (fq, fk, v))
        linear_step_triton(*one, state, k_log_scale=s[:, :, :1])
        log_alpha = torch.zeros(2, 2, 2)
        log_gamma = torch.tensor([[-0.1, -0.5]]).expand(2, 2, 2)
        decay_linear_attention_triton(
            fq, fk, v, log_alpha, log_gamma, causal=True, k_log_scale=s, chunk_size=CHUNK
        )
        table = torch.zeros(2, 2 * LENGTH - 1)
        toeplitz_linear_attention_triton(
            fq, fk, v, table, causal=True, k_log_scale=s, block_size=CHUNK
        )
        band = torch.zeros(2, 7)
        banded_linear_attention_triton(fq, fk, v, band, 3, k_log_scale=s, chunk_size=CHUNK)
    # the decay kernel's own backward at the largest sizes it runs at: its dq and dk scans
    # sum (Dv + 1) × M, so Dv or M is halved where the state would outgrow the forward's
    for features, cols in ((m, dv), (m, dv // 2), (m // 2, dv)):
        log_gamma = torch.tensor([[-0.1, -0.5]]).expand(2, 2, 2).requires_grad_()
        out = decay_linear_attention_triton(
            fq[..., :features], fk[..., :features], v[..., :cols], torch.zeros(2, 2, 2),
            log_gamma, k_log_scale=s, chunk_size=CHUNK,
        )  # fmt: skip
        out.float().sum().backward()
    # the window sums' backward (exact Toeplitz; the band of the banded kernels, whose own
    # backward runs where the far fields' scans fit)
    table = torch.zeros(2, 2 * LENGTH - 1, requires_grad=True)
    out = toeplitz_linear_attention_triton(fq, fk, v, table, k_log_scale=s, block_size=CHUNK)
    band = torch.zeros(2, 7, requires_grad=True)
    out = out + banded_linear_attention_triton(
        fq[..., : m // 2], fk[..., : m // 2], v, band, 3, k_log_scale=s, chunk_size=CHUNK
    )
    out.float().sum().backward()


def _compiled(launches: list[dict], targets: list[int]) -> list[list[list[int]]]:
    """Shared bytes and tensor-core products per launch and target, from the compile script."""
    if not _can_target_cuda():
        pytest.skip("this triton cannot compile for CUDA without a GPU")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    request = json.dumps({"launches": launches, "capabilities": targets})
    done = subprocess.run(
        [sys.executable, str(_SCRIPT)],
        input=request,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[list[list[int]]] = json.loads(done.stdout)
    return results


def _can_target_cuda() -> bool:
    try:
        from triton.compiler.compiler import make_backend

        make_backend(GPUTarget("cuda", 80, 32))
    except Exception:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_kernel_fits_the_shared_memory_of_sm80_and_sm90(dtype: torch.dtype) -> None:
    launches = _recorded(lambda: _run_every_kernel(dtype))
    kernels = {launch["kernel"].split(":")[1] for launch in launches}
    assert len(kernels) >= 12, sorted(kernels)
    report = []
    # fp32 products are not tensor-core products on either target, so sm_80, the smaller
    # limit, decides (sm_90 needed as much or less where both were compiled: before.txt in
    # benchmarks/results/triton-shared-memory/); bf16 tiles take sm_90's warp-group layouts,
    # and fp64 (small sizes, quick to compile) is checked on both too
    targets = [80] if dtype == torch.float32 else sorted(LIMITS)
    for launch, per_target in zip(launches, _compiled(launches, targets), strict=True):
        for cap, (shared, products) in zip(targets, per_target, strict=True):
            report.append((launch["kernel"], cap, shared, products))
    print("\n".join(f"{dtype} {k} sm{c}: {b} B, {p} mma" for k, c, b, p in report))
    over = [(k, c, b) for k, c, b, _ in report if b > LIMITS[c]]
    assert not over, over
    if dtype == torch.bfloat16:  # the scanning kernels run their products on tensor cores
        scalar = [(k, c) for k, c, _, products in report if products == 0 and k in SCANS]
        assert not scalar, scalar
        assert {k for k, *_ in report} >= SCANS
