"""Decoding and the side-by-side row of ``benchmarks/sparse_speed.py``.

* :func:`measure_decoding`: time per token of ``local`` (ring buffer of the last W keys) and
  ``softmax`` (key/value cache) ``step`` calls after a context read by ``prefill``.
* :func:`side_by_side`: kattn ``local`` with ``variant="blocked"`` against lucidrains'
  ``local-attention`` (``LocalAttention``, rotary and xpos off) on the same q, k, v: the max
  abs difference of the outputs and the ratio of times.

Imported by ``sparse_speed.py``, which Python runs with this folder on its path.
"""

from __future__ import annotations

import importlib
import statistics
import time
from typing import Any

import torch

import kattn
from kattn.bench import measure_time

B, H, D = 1, 4, 64
DECODERS = ("local", "softmax")


def _qkv(length: int, seed: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, length, D, generator=g).requires_grad_(grad) for _ in range(3))


def _decoder(name: str, window: int) -> kattn.Attention:
    options = {"window": window} if name == "local" else {}
    return kattn.build(name, head_dim=D, num_heads=H, **options).eval()


def check_decoding(window: int, prompt: int = 40, steps: int = 8) -> dict[str, float]:
    """Max abs difference of ``prefill`` then ``step`` outputs from the causal forward."""
    q, k, v = _qkv(prompt + steps, seed=3)
    errors = {}
    with torch.inference_mode():
        for name in DECODERS:
            attn = _decoder(name, min(window, prompt // 2))
            expected = attn(q, k, v, causal=True)
            out, state = attn.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])
            outs = [out]
            for t in range(prompt, prompt + steps):
                sl = slice(t, t + 1)
                out, state = attn.step(q[:, :, sl], k[:, :, sl], v[:, :, sl], state)
                outs.append(out)
            errors[name] = float((torch.cat(outs, dim=2) - expected).abs().max())
    for name, err in errors.items():
        if not err <= 1e-4:
            raise SystemExit(f"correctness check failed: {name} decoding differs by {err:.3g}")
    return errors


def measure_decoding(contexts: list[int], steps: int, rounds: int, window: int) -> list[dict]:
    """Prefill every context for every decoder (timed once each), then time ``step`` in
    interleaved rounds over all (context, decoder) pairs, ``steps`` calls each; the reported
    time is the median of the round medians, and a burst of load from other processes hits
    all contexts of a round alike (the per-round ratios to the shortest context are kept).
    Every step advances its state by one token."""
    check_decoding(window)
    token = _qkv(1, seed=4)
    fns, prefill = {}, {}
    for context in contexts:
        q, k, v = _qkv(context, seed=context)
        for name in DECODERS:
            attn = _decoder(name, window)
            with torch.inference_mode():
                start = time.perf_counter()
                state = attn.prefill(q, k, v)[1]
            prefill[name, context] = time.perf_counter() - start
            fns[name, context] = _stepper(attn, state, token)
    per_round: dict[tuple[str, int], list[float]] = {key: [] for key in fns}
    for r in range(rounds):
        for key, fn in fns.items():  # the first round warms up (a cache may grow there)
            per_round[key].append(measure_time(fn, repeats=steps, warmup=3 if r == 0 else 0).median)
        print(
            f"decode round {r + 1}/{rounds}: "
            + ", ".join(f"{n}@{c} {t[-1] * 1e6:.0f} µs" for (n, c), t in per_round.items()),
            flush=True,
        )
    rows = []
    for (name, context), times in per_round.items():
        first = per_round[name, contexts[0]]
        rows.append(
            {
                "mechanism": name,
                "context": context,
                "step_seconds": statistics.median(times),
                "round_step_seconds": times,
                "round_ratio_to_shortest": [a / b for a, b in zip(times, first, strict=True)],
                "prefill_seconds": prefill[name, context],
            }
        )
    return sorted(rows, key=lambda r: (DECODERS.index(r["mechanism"]), r["context"]))


def _stepper(attn: kattn.Attention, state: Any, token: tuple) -> Any:
    """One decoding step of ``attn`` from its last state, which it advances."""
    current = [state]

    def step() -> None:
        with torch.inference_mode():
            current[0] = attn.step(*token, current[0])[1]

    return step


def _lucidrains() -> Any:
    """``local_attention`` if importable, else None."""
    try:
        return importlib.import_module("local_attention")
    except ImportError:
        return None


def side_by_side(
    lengths: list[int], window: int, rounds: int, notes: list[str], blocked: bool
) -> tuple[list[dict], str | None]:
    """kattn ``local`` blocked against lucidrains' ``LocalAttention`` with the same window
    (``window_size``), one block back and (non-causal) one forward, at ``lengths``, causal
    and not: max abs difference and times (forward; forward + backward)."""
    module = _lucidrains()
    if module is None:
        notes.append(
            "lucidrains `local-attention` not importable (give "
            "`--local-attention-path`): side-by-side row skipped."
        )
        return [], None
    if not blocked:
        notes.append(
            "lucidrains `local-attention` found, but kattn `local` has no blocked "
            "variant yet: side-by-side row skipped."
        )
        return [], None
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("local-attention")
    except PackageNotFoundError:
        found = "(version unknown)"
    rows = []
    for length in lengths:
        for causal in (False, True):
            rows.append(_compare(module, length, window, causal, rounds))
    return rows, found


def _compare(module: Any, length: int, window: int, causal: bool, rounds: int) -> dict:
    ours = kattn.build("local", head_dim=D, num_heads=H, window=window, variant="blocked").eval()
    theirs = module.LocalAttention(
        window_size=window,
        causal=causal,
        look_backward=1,
        look_forward=0 if causal else 1,
        autopad=True,
        exact_windowsize=False,
        use_rotary_pos_emb=False,
        use_xpos=False,
    ).eval()
    q, k, v = _qkv(length, seed=5)
    grad = torch.randn(B, H, length, D, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        diff = float((ours(q, k, v, causal=causal) - theirs(q, k, v)).abs().max())
    calls = {"kattn": lambda q, k, v: ours(q, k, v, causal=causal), "lucidrains": theirs}
    fns: dict[str, Any] = {}
    for who, call in calls.items():
        fns[f"{who}_forward"] = _no_grad(call, q, k, v)
        fns[f"{who}_train"] = _train(call, q, k, v, grad)
    per_round: dict[str, list[float]] = {n: [] for n in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            per_round[name].append(measure_time(fn, repeats=3, warmup=0).median)
    row: dict[str, Any] = {"length": length, "causal": causal, "max_abs_diff": diff}
    row.update({n: statistics.median(t) for n, t in per_round.items()})
    print(
        f"side by side L={length} causal={causal}: max abs diff {diff:.1e}, "
        + ", ".join(f"{n} {row[n] * 1e3:.1f} ms" for n in fns),
        flush=True,
    )
    return row


def _no_grad(call, q, k, v):
    def run() -> None:
        with torch.no_grad():
            call(q, k, v)

    return run


def _train(call, q, k, v, grad):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def run() -> None:
        q.grad = k.grad = v.grad = None
        call(q, k, v).backward(grad)

    return run
