"""Pictures of attention patterns: which keys each query reads, for the mechanisms that compute
exact softmax over a fixed sparse pattern (local windows, Longformer, BigBird, the Sparse
Transformer). Any registered mechanism whose module has a ``pattern(length, *, causal)``
method is drawn: one black-and-white (L, L) image per head pattern, query rows top to bottom.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..registry import MECHANISMS, available, build
from .style import pyplot, save_figure

__all__ = [
    "PatternSummary",
    "draw_pattern",
    "mechanism_pattern",
    "pattern_mechanisms",
    "write_patterns",
]


@dataclass(frozen=True)
class PatternSummary:
    """What one mechanism's pattern holds at one length: the mean and largest number of keys
    a query reads (over heads and queries), their fraction of L, and the image written."""

    mechanism: str
    length: int
    causal: bool
    options: dict[str, Any]
    mean_keys: float
    max_keys: int
    density: float
    image: str | None


def pattern_mechanisms() -> list[str]:
    """The registered mechanisms whose modules expose ``pattern(length, *, causal)``."""
    return [n for n in available() if callable(getattr(MECHANISMS.get(n).cls, "pattern", None))]


def mechanism_pattern(
    name: str,
    length: int,
    *,
    causal: bool = False,
    num_heads: int = 4,
    head_dim: int = 64,
    options: Mapping[str, Any] | None = None,
) -> Tensor:
    """The bool ``(heads or 1, L, L)`` pattern of mechanism ``name`` built with ``options``
    (evaluation mode: a random pattern is the draw used in evaluation)."""
    if name not in pattern_mechanisms():
        raise ValueError(
            f"{name!r} has no fixed attention pattern to draw; mechanisms with one: "
            f"{', '.join(pattern_mechanisms())}"
        )
    torch.manual_seed(0)
    module = build(name, head_dim=head_dim, num_heads=num_heads, **dict(options or {})).eval()
    with torch.no_grad():
        pattern: Tensor = getattr(module, "pattern")(length, causal=causal)  # noqa: B009
    return pattern.cpu()


def draw_pattern(pattern: Tensor, path: Path, title: str) -> Path | None:
    """Write ``pattern`` (bool ``(P, L, L)``, one panel per distinct head pattern, at most 4)
    as a PNG; None when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    panels = _distinct(pattern)[:4]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), squeeze=False)
    for ax, (heads, image) in zip(axes[0], panels, strict=True):
        ax.imshow(image.numpy(), cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
        ax.set_title(heads, fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def write_patterns(
    names: Sequence[str],
    out_dir: Path | None,
    *,
    length: int = 256,
    causal: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    tag: str = "",
) -> list[PatternSummary]:
    """Build each mechanism with its ``options[name]``, summarise its pattern at ``length``
    and, with ``out_dir``, draw it to ``out_dir/<name>[-causal][-tag].png``."""
    summaries = []
    for name in names:
        opts = dict((options or {}).get(name, {}))
        allowed = mechanism_pattern(name, length, causal=causal, options=opts)
        keys = allowed.sum(dim=-1)
        image = None
        if out_dir is not None:
            stem = "-".join([name] + (["causal"] if causal else []) + ([tag] if tag else []))
            shown = ", ".join(f"{k}={v}" for k, v in opts.items())
            title = f"{name}, L={length}" + (", causal" if causal else "")
            written = draw_pattern(allowed, out_dir / f"{stem}.png", f"{title}\n{shown}".strip())
            image = None if written is None else str(written)
        summaries.append(
            PatternSummary(
                mechanism=name,
                length=length,
                causal=causal,
                options=opts,
                mean_keys=float(keys.double().mean()),
                max_keys=int(keys.max()),
                density=float(allowed.double().mean()),
                image=image,
            )
        )
    return summaries


def _distinct(pattern: Tensor) -> list[tuple[str, Tensor]]:
    """The distinct head patterns of ``(P, L, L)``, each with the heads that share it."""
    groups: list[tuple[list[int], Tensor]] = []
    for h, image in enumerate(pattern):
        for heads, seen in groups:
            if torch.equal(seen, image):
                heads.append(h)
                break
        else:
            groups.append(([h], image))
    if len(groups) == 1 and pattern.shape[0] == 1:
        return [("all heads", groups[0][1])]
    return [(f"head{'s' if len(h) > 1 else ''} {', '.join(map(str, h))}", img) for h, img in groups]
