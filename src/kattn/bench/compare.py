"""A quick comparison of every registered mechanism against exact softmax attention.

For each mechanism: relative error of its output against softmax on the same random inputs
(non-causal and causal), median forward time and its speed-up over softmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ..functional.softmax import softmax_attention
from ..registry import available, build, spec
from .timing import measure_time


@dataclass(frozen=True)
class ComparisonRow:
    """One mechanism's numbers; errors are ‖out − softmax‖ / ‖softmax‖ (None: unsupported)."""

    name: str
    exact: bool
    error: float | None
    causal_error: float | None
    time_ms: float
    speedup: float


def compare_mechanisms(
    names: Sequence[str] | None = None,
    *,
    batch: int = 1,
    heads: int = 4,
    length: int = 1024,
    head_dim: int = 64,
    repeats: int = 5,
    input_std: float = 1.0,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[ComparisonRow]:
    """Compare ``names`` (default: all registered) with softmax on random inputs.

    q and k have iid N(0, input_std²) entries, v has N(0, 1) entries.
    """
    names = list(names or available())
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g) for _ in range(3))
    q, k = q * input_std, k * input_std
    with torch.no_grad():
        exact = softmax_attention(q, k, v)
        exact_causal = softmax_attention(q, k, v, causal=True)
        reference = build("softmax", head_dim=head_dim, num_heads=heads).eval()
        base = measure_time(lambda: reference(q, k, v), repeats=repeats).median
        rows = []
        for name in names:
            if progress is not None:
                progress(name)
            torch.manual_seed(seed)
            attn = build(name, head_dim=head_dim, num_heads=heads, max_len=length).eval()
            error = _relative_error(attn(q, k, v), exact)
            causal = (
                _relative_error(attn(q, k, v, causal=True), exact_causal)
                if attn.supports_causal
                else None
            )
            seconds = measure_time(partial(attn, q, k, v), repeats=repeats).median
            rows.append(
                ComparisonRow(
                    name, spec(name).is_exact, error, causal, seconds * 1e3, base / seconds
                )
            )
    return rows


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def format_table(rows: Sequence[ComparisonRow]) -> str:
    """A markdown table of the rows."""
    header = [
        "mechanism",
        "exact",
        "rel. error",
        "rel. error (causal)",
        "forward ms",
        "speed-up vs softmax",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        causal = "n/a" if r.causal_error is None else f"{r.causal_error:.3g}"
        lines.append(
            f"| {r.name} | {'yes' if r.exact else 'no'} | {r.error:.3g} | {causal} | "
            f"{r.time_ms:.2f} | {r.speedup:.2f}× |"
        )
    return "\n".join(lines)
