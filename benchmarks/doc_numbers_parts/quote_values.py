"""The values that quoted sentences take from result files: ratios, ranges and rows looked up
by mechanism, length, batch or seed."""

from __future__ import annotations

import re


def ratio(d: dict, key: str) -> float:
    return float(d["ratios"][key])


def nystrom(d: dict, name: str, baseline: str = "softmax", length: str = "4096") -> float:
    return d["seconds"][length][baseline] / d["seconds"][length][name]


def nystrom_range(d: dict, name: str, length: str = "4096") -> tuple[float, float]:
    rounds = d["round_seconds"][length]
    per_round = [s / m for s, m in zip(rounds["softmax"], rounds[name], strict=True)]
    return min(per_round), max(per_round)


def nystrom_memory(d: dict, name: str, length: str = "4096") -> float:
    peaks = d["peak_memory_bytes"][length]
    return 100 * peaks[name] / peaks["softmax (materialised)"]


def learned(d: dict, name: str) -> float:
    at = d["seconds"]["4096"]
    return at["softmax"] / at[name]


FFK = ("ffk_linear", "ffk_fcnn", "ffk_glu", "ffk_oglu", "ffk_aoglu", "ffk_ae", "ffk_vae")


def learned_min_round(d: dict) -> float:
    rounds = d["round_seconds"]["4096"]
    return min(
        s / m
        for name in rounds
        if name != "softmax"
        for s, m in zip(rounds["softmax"], rounds[name], strict=True)
    )


def spectral(rows: list[dict], features: int, length: int = 1024) -> float:
    (row,) = (
        r
        for r in rows
        if r["mechanism"] == "skyformer" and r["length"] == length and r["features"] == features
    )
    return float(row["rel_error"])


def lm(d: dict, batch: int, context: int, name: str) -> dict:
    (row,) = (
        r
        for r in d["decode"]
        if (r["batch"], r["context"], r["mechanism"]) == (batch, context, name)
    )
    return row


def lm_ratio(d: dict, name: str, batch: int = 16, context: int = 8192) -> float:
    return (
        lm(d, batch, context, "softmax")["step_seconds"]
        / lm(d, batch, context, name)["step_seconds"]
    )


def lm_target(d: dict, name: str) -> dict:
    (row,) = (t for t in d["targets"] if t["name"] == name)
    return row


def lm_train_row(d: dict, block: int, name: str) -> dict:
    (row,) = (r for r in d["train"] if (r["block"], r["mechanism"]) == (block, name))
    return row


def speed(d: dict, name: str, length: int) -> dict:
    (row,) = (r for r in d["rows"] if (r["mechanism"], r["length"]) == (name, length))
    return row


def crossover(d: dict, name: str) -> float:
    (row,) = (c for c in d["crossovers"] if c["mechanism"] == name)
    return float(row["length"])


def error(d: dict, name: str, length: int = 1024) -> float:
    (row,) = (
        r for r in d["rows"] if (r["mechanism"], r["length"], r["causal"]) == (name, length, False)
    )
    return float(row["rel_error"])


def blocked(d: dict, features: int, length: int, mode: str) -> float:
    (row,) = (
        r for r in d["rows"] if (r["features"], r["length"], r["mode"]) == (features, length, mode)
    )
    return row["fft_seconds"] / row["blocked_seconds"]


def doublings(rows: list[dict]) -> list[float]:
    """Skyformer's spectral error at 2m over that at m, every length and m."""
    sky = {(r["length"], r["features"]): r["rel_error"] for r in rows
           if r["mechanism"] == "skyformer"}  # fmt: skip
    return [e / sky[n, m // 2] for (n, m), e in sky.items() if (n, m // 2) in sky]


def pinv(d: dict, length: int, init: str) -> dict:
    (row,) = (r for r in d["approximation"] if (r["length"], r["init"]) == (length, init))
    return row


def exponent(value: float) -> str:
    """``1e-3`` rather than ``1e-03``."""
    return re.sub(r"e([-+])0*", r"e\1", f"{value:.0e}")


def largest_gradient_step(d: dict, init: str, seed: int) -> int:
    """The step (counted from 1) of the largest gradient norm of a training run."""
    norms = d["training"]["runs"][init][seed]["grad_norms"]
    return 1 + max(range(len(norms)), key=norms.__getitem__)
