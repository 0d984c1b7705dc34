"""How benchmark plots look: one colour per mechanism, the same in every plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..registry import MECHANISMS, derived_colour, spec

#: colours of plot lines that are not registered mechanisms (a mechanism's colour is part of
#: its registration: ``kattn.spec(name).colour``)
EXTRA_COLOURS = {"softmax (materialised)": "#7f7f7f"}


def mechanism_color(name: str) -> str:
    """The colour of ``name``: its registered colour, or a stable pick from a spare palette."""
    if name in EXTRA_COLOURS:
        return EXTRA_COLOURS[name]
    return spec(name).colour if name in MECHANISMS else derived_colour(name)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None (with a warning) when
    matplotlib is not installed (``pip install kattn[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import warnings

        warnings.warn("matplotlib is not installed: no plot written", stacklevel=3)
        return None
    return plt


def save_figure(fig: Any, path: Path, caption: str = "") -> Path:
    """Write ``fig`` to ``path`` (PNG, 120 dpi) with ``caption`` under it, and close it."""
    import matplotlib.pyplot as plt

    if caption:
        fig.text(0.5, -0.02, caption, ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
