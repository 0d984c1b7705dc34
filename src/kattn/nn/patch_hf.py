"""``kattn.patch`` for Hugging Face models: hand them to ``kattn.hf``, or say why not.

A Hugging Face model whose attention layers call transformers' attention interface
(``ALL_ATTENTION_FUNCTIONS``) runs a kattn mechanism through ``kattn.hf``, which registers the
mechanism with that interface and gives each layer its own kattn module. Models whose
attention layers compute softmax inline (transformers' ``_can_set_attn_implementation()`` is
False for them) offer no place to put it: ``kattn.patch`` reports them instead.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from torch import nn

from .patch_report import Skipped, attention_like

_NO_INTERFACE = (
    "inside {model}, whose attention layers compute softmax attention inline instead of "
    "calling transformers' attention interface (its _can_set_attn_implementation() is False): "
    "kattn cannot reach its attention core"
)
_NO_KATTN_HF = (
    "inside {model}, a Hugging Face model: its attention runs through transformers' attention "
    "interface, which kattn.hf plugs kattn mechanisms into, and kattn.hf is not available in "
    "this installation ({error})"
)


def find_hf_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face ``PreTrainedModel`` modules of ``model`` (model included)."""
    library = sys.modules.get("transformers.modeling_utils")
    if library is None:
        return []
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        outer = any(name == n or name.startswith(n + ".") or not n for n, _ in found)
        if isinstance(module, library.PreTrainedModel) and not outer:
            found.append((name, module))
    return found


def interface_applies(module: nn.Module) -> bool:
    """Whether the attention layers of Hugging Face model ``module`` call the interface."""
    can_set = getattr(type(module), "_can_set_attn_implementation", None)
    return bool(can_set()) if callable(can_set) else False


def check_hf(module: nn.Module, mechanism: str, options: dict[str, Any]) -> None:
    """Raise what ``kattn.hf.use`` would refuse for Hugging Face model ``module``
    (``kattn.hf.check_use``: options ``config.json`` cannot hold, the options the model
    gives such as ``dropout`` or ``max_len``, an unknown mechanism, an option the mechanism
    rejects), so that ``kattn.patch`` refuses before changing any part of a model; nothing
    where :func:`patch_hf` would leave the model as it is."""
    hf, _ = _kattn_hf("", module)
    if hf is not None:
        hf.check_use(module, mechanism, **options)


def patch_hf(
    name: str, module: nn.Module, mechanism: str, options: dict[str, Any]
) -> list[Skipped]:
    """Run ``mechanism`` in Hugging Face model ``module`` through ``kattn.hf``.

    Returns:
        The attention modules left as they were (with the reason): none when ``kattn.hf``
        took the model; all of its attention-like modules when the interface does not apply
        or ``kattn.hf`` is unavailable.
    """
    hf, reason = _kattn_hf(name, module)
    if hf is None:
        return _inside(name, module, reason)
    hf.use(module, mechanism, **options)
    return []


def _kattn_hf(name: str, module: nn.Module) -> tuple[Any, str]:
    """``kattn.hf`` if it can run Hugging Face model ``module`` (named ``name`` in the outer
    model), else None and the reason: the interface does not apply, or kattn.hf is missing."""
    model_name = f"{name or 'the model'} ({type(module).__name__})"
    if not interface_applies(module):
        return None, _NO_INTERFACE.format(model=model_name)
    try:
        return importlib.import_module("kattn.hf"), ""
    except ImportError as error:
        return None, _NO_KATTN_HF.format(model=model_name, error=error)


def _inside(name: str, module: nn.Module, reason: str) -> list[Skipped]:
    """The attention-like modules of ``module``, named in the outer model, with ``reason``."""
    found = attention_like(module, handled=(), reason=reason)
    prefix = f"{name}." if name else ""
    return [Skipped(prefix + s.name if s.name else name, s.kind, s.reason) for s in found] or [
        Skipped(name, type(module).__name__, reason)
    ]
