"""How benchmark plots look: one colour per mechanism, the same in every plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: fixed colours (matplotlib's tab20 and tab10 hues) so a mechanism is recognisable across plots
MECHANISM_COLORS = {
    "softmax": "#000000",
    "softmax (materialised)": "#7f7f7f",
    "performer": "#1f77b4",
    "rfa": "#aec7e8",
    "linear": "#17becf",
    "kernelized": "#9edae5",
    "nprf_rpe": "#2ca02c",
    "prf_rpe": "#98df8a",
    "gaussian": "#8c564b",
    "skyformer": "#d62728",
    "nystromformer": "#ff7f0e",
    "linformer": "#9467bd",
    "simpletron": "#e377c2",
    # learned kernels (tab20b hues): one hue per family, light for RKS, dark for PRF
    "gmm_prf": "#393b79",
    "gmm_rks": "#9c9ede",
    "fastfood_prf": "#637939",
    "fastfood_rks": "#b5cf6b",
    "generative_prf": "#8c6d31",
    "generative_rks": "#e7ba52",
    # feed-forward kernels (tab20b / tab20c hues)
    "ffk_linear": "#843c39",
    "ffk_fcnn": "#ad494a",
    "ffk_glu": "#d6616b",
    "ffk_oglu": "#e7969c",
    "ffk_aoglu": "#7b4173",
    "ffk_ae": "#a55194",
    "ffk_vae": "#ce6dbd",
}
_FALLBACK = ("#bcbd22", "#e377c2", "#c49c94", "#f7b6d2", "#c5b0d5", "#dbdb8d", "#ff9896")


def mechanism_color(name: str) -> str:
    """The colour of ``name`` (a stable pick from a spare palette for unlisted names)."""
    if name in MECHANISM_COLORS:
        return MECHANISM_COLORS[name]
    return _FALLBACK[sum(name.encode()) % len(_FALLBACK)]


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
