"""A per-head temperature ``τ_h`` on normalised queries and keys: the logits (or the kernel's
argument) become ``τ_h · q̂·k̂``.

With ℓ2-normalised q and k (Luo et al. 2021, §3.3) ``q̂·k̂ ∈ [−1, 1]``, so a fixed scale bounds
how sharp attention can be; a learnt ``τ_h`` per head lets each head choose. It is stored as
``log_temperature`` ``(H,)``: an ``nn.Parameter`` when learnt, a buffer when fixed at a value
other than 1, and absent (None) at the fixed default 1, so that modules without a temperature
keep their state dicts. Softmax and kernelized attention use the same name and shape, so the
entry moves from one to the other when a trained model is converted.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import positive_float
from ..registry import check_option_types


def init_temperature(
    module: nn.Module,
    *,
    num_heads: int,
    temperature: float,
    learn_temperature: bool,
    normalize_qk: bool,
) -> None:
    """Set ``module.log_temperature``: a parameter ``(H,)`` at ``log temperature`` when
    ``learn_temperature``, a buffer when the fixed ``temperature`` is not 1, else None.

    Raises:
        TypeError: ``temperature`` not a real number or ``learn_temperature`` not a bool.
        ValueError: ``temperature`` not positive and finite, or a temperature other than the
            fixed 1 without ``normalize_qk`` (it scales ``q̂·k̂``; unnormalised logits have
            ``scale``).
    """
    name = type(module).__name__
    check_option_types(
        name,
        {"temperature": temperature, "learn_temperature": learn_temperature},
        {"temperature": float, "learn_temperature": bool},
    )
    temperature = positive_float("temperature", temperature)
    if (learn_temperature or temperature != 1.0) and not normalize_qk:
        raise ValueError(
            f"{name}: temperature and learn_temperature scale the normalised q̂·k̂ and need "
            "normalize_qk=True; without normalisation the logits' scale is the scale option"
        )
    log_t = torch.full((num_heads,), math.log(temperature))
    if learn_temperature:
        module.log_temperature = nn.Parameter(log_t)
    elif temperature != 1.0:
        module.register_buffer("log_temperature", log_t)
    else:  # a None buffer: the attribute exists, the state dict has no entry
        module.register_buffer("log_temperature", None)


def head_factor(log_temperature: Tensor | None, like: Tensor, power: float = 1.0) -> Tensor | None:
    """``τ_h^power`` shaped ``(H, 1, 1)`` in ``like``'s dtype, to multiply a ``(B, H, L, D)``
    tensor; None without a temperature."""
    if log_temperature is None:
        return None
    return torch.exp(power * log_temperature).to(like.dtype)[:, None, None]


def temperature_repr(log_temperature: Tensor | None) -> str:
    """``", temperature=…"`` for ``extra_repr`` (the values per head, learnt or fixed)."""
    if log_temperature is None:
        return ""
    values = ", ".join(f"{t:.4g}" for t in torch.exp(log_temperature.detach()).tolist())
    kind = "learnt" if isinstance(log_temperature, nn.Parameter) else "fixed"
    return f", temperature=({values}) {kind}"
