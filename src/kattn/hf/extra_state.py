"""kattn modules' extra state (``get_extra_state``: e.g. where a feature map is in its redraw
schedule) as tensors, so that safetensors, which stores only tensors, saves it with the model.

Each submodule of a kattn module with an extra state gets, on the instance, a
``get_extra_state`` that returns the JSON text of the state as a ``uint8`` tensor and a
``set_extra_state`` that reads such a tensor back (transformers' loader and
``load_state_dict`` both call it); the classes are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


def encode(value: Any) -> Tensor:
    """A JSON value as a ``uint8`` tensor of its UTF-8 text."""
    return torch.tensor(list(json.dumps(value).encode("utf-8")), dtype=torch.uint8)


def decode(tensor: Tensor) -> Any:
    """The JSON value :func:`encode` wrote into ``tensor``."""
    return json.loads(bytes(tensor.to("cpu", torch.uint8).tolist()).decode("utf-8"))


def store_extra_state_as_tensors(module: nn.Module) -> None:
    """Make the extra state of ``module`` and its submodules a tensor (module docstring)."""
    for sub in module.modules():
        if type(sub).get_extra_state is nn.Module.get_extra_state:
            continue
        if getattr(sub, "_kattn_tensor_extra_state", False):
            continue
        get, put = type(sub).get_extra_state, type(sub).set_extra_state
        sub.get_extra_state = _getter(sub, get)  # type: ignore[method-assign]
        sub.set_extra_state = _setter(sub, put)  # type: ignore[method-assign, assignment]
        sub._kattn_tensor_extra_state = True  # type: ignore[assignment]


def _getter(sub: nn.Module, get: Callable[[nn.Module], Any]) -> Callable[[], Tensor]:
    return lambda: encode(get(sub))


def _setter(sub: nn.Module, put: Callable[[nn.Module, Any], None]) -> Callable[[Any], None]:
    def set_extra_state(state: Any) -> None:
        put(sub, decode(state) if isinstance(state, Tensor) else state)

    return set_extra_state
