"""Counters kept as a module's extra state in ``state_dict()`` (where a feature map is in its
redraw schedule, a seeded mechanism's seed and draws), stored as one ``int64`` tensor.

A tensor, unlike the dict that ``get_extra_state`` may return, is what safetensors stores, so
``save_pretrained`` of a Hugging Face model holding kattn modules saves it as it is. The
state_dict key (``..._extra_state``) is PyTorch's; checkpoints written when the state was a
dict of the same names still load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

#: The largest counter an ``int64`` holds.
INT64_MAX = 2**63 - 1


def counters_to_tensor(values: Sequence[int]) -> Tensor:
    """The counters ``values`` as a CPU ``int64`` tensor of shape ``(len(values),)``."""
    return torch.tensor(list(values), dtype=torch.int64)


def counters_from_state(state: Any, names: Sequence[str]) -> tuple[int, ...]:
    """The counters ``names`` (ints in ``[0, 2**63)``) read from an extra state: the ``int64``
    tensor of :func:`counters_to_tensor`, or the dict ``{name: int}`` of older checkpoints.

    Raises:
        ValueError: ``state`` is neither, has other names or shape, or a counter out of range.
    """
    values: list[Any] | None = None
    if isinstance(state, Tensor):
        if state.dtype == torch.int64 and tuple(state.shape) == (len(names),):
            values = state.tolist()
    elif isinstance(state, dict) and set(state) == set(names):
        values = [state[name] for name in names]
    if values is None or not all(_is_counter(value) for value in values):
        fields = ", ".join(names)
        raise ValueError(
            f"extra state must be an int64 tensor of [{fields}] (each an int >= 0), or the "
            f"dict of older checkpoints with those keys, got {state!r}"
        )
    return tuple(values)


def _is_counter(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX
