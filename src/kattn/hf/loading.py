"""Putting kattn mechanisms into transformers models: :func:`use` on a model in memory,
:func:`from_pretrained` for a saved one.

Both record the mechanism and its options in the model's config (``config.kattn``), which
``save_pretrained`` writes to ``config.json``; the kattn modules' tensors are in the model's
``state_dict``, so a saved model comes back exactly with :func:`from_pretrained`.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import AutoConfig

from .attach import (
    CONFIG_KEY,
    LOADING,
    attention_modules,
    build_for,
    complete,
    install,
    layer_sizes,
    recorded_options,
    refuse_layer_options,
)
from .registration import implementation_name

M = TypeVar("M", bound=nn.Module)


def use(model: M, mechanism: str, **options: Any) -> M:
    """Run every attention layer of transformers model ``model`` with kattn ``mechanism``.

    Each attention module gets its own kattn module (``module.kattn``, built with
    ``options``; see :mod:`kattn.hf.attach`), the config records the mechanism and options,
    and the model's implementation becomes ``"kattn:<mechanism>"``. The projections of the
    model are kept; the kattn modules are new (their random features drawn from torch's
    generator), so seed torch first for a reproducible model. Every kattn module is built
    before the first is attached, so a refusal (an option the mechanism rejects, for one)
    leaves ``model`` as it was.

    Returns:
        ``model``, changed in place.
    """
    modules = _checked_modules(model, mechanism, options)
    built = [build_for(module, mechanism, options) for module in modules]
    for module, made in zip(modules, built, strict=True):
        install(module, made, mechanism, options)
    _record(model, modules, mechanism, options)
    implementation = implementation_name(mechanism)
    model.set_attn_implementation(implementation)  # type: ignore[operator]
    if model.config._attn_implementation != implementation:  # type: ignore[union-attr]
        raise ValueError(_CANNOT_SET.format(model=type(model).__name__))
    return model


_CANNOT_SET = (
    "{model} does not let its attention implementation be set (set_attn_implementation); "
    "kattn.hf needs a model that uses AttentionInterface"
)


def check_use(model: nn.Module, mechanism: str, **options: Any) -> None:
    """Raise what ``use(model, mechanism, **options)`` would refuse, changing nothing.

    Besides :func:`check_options` and the model's attention modules, one kattn module per
    distinct layer size is built and dropped, so that an option the mechanism rejects is
    refused here; torch's generator is left as it was (``use`` draws the same random
    features after this as without it)."""
    modules = _checked_modules(model, mechanism, options)
    sizes = {layer_sizes(module): module for module in modules}
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use warns when it builds them
        for module in sizes.values():
            build_for(module, mechanism, options, device="cpu")


def _checked_modules(model: nn.Module, mechanism: str, options: dict[str, Any]) -> list[Any]:
    """The attention modules :func:`use` gives kattn modules, after the checks it makes
    before changing anything: the options, the modules, the implementation settable."""
    check_options(mechanism, options)
    modules = attention_modules(model)
    if not modules:
        raise ValueError(
            "model has no attention module that transformers' AttentionInterface dispatches; "
            "kattn.hf runs only models whose attention does"
        )
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if not callable(can_set) or not can_set():
        raise ValueError(_CANNOT_SET.format(model=type(model).__name__))
    return modules


def from_pretrained(
    model_class: Any,
    path: str,
    mechanism: str | None = None,
    *,
    options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``model_class.from_pretrained(path, **kwargs)`` with kattn ``mechanism`` in every
    attention layer, its modules made before the weights load, so the tensors a kattn
    checkpoint holds for them are restored (a checkpoint without them gets fresh ones).

    Args:
        model_class: a class of transformers (``AutoModelForCausalLM``, ``BertModel``, ...).
        path: a local directory written by ``save_pretrained``.
        mechanism: the kattn mechanism; default: the one the checkpoint's config records.
        options: the mechanism's options; the recorded ones (for the same mechanism) are
            used where these do not say otherwise.
        **kwargs: passed to ``model_class.from_pretrained`` (``dtype``, ``device_map``,
            ``output_loading_info``, ...), except ``attn_implementation``.
    """
    if "attn_implementation" in kwargs:
        raise TypeError("attn_implementation: kattn.hf.from_pretrained sets it from mechanism")
    config = kwargs.get("config") or AutoConfig.from_pretrained(path)
    if mechanism is None:
        record = getattr(config, CONFIG_KEY, None)
        if not isinstance(record, dict):
            raise ValueError(
                f"mechanism: the config in {path!r} records no kattn mechanism; pass one"
            )
        mechanism = str(record["mechanism"])
    merged = {**recorded_options(config, mechanism), **(options or {})}
    _check_recordable(merged)
    implementation = implementation_name(mechanism)
    token = LOADING.set((mechanism, merged))
    try:
        model = model_class.from_pretrained(path, attn_implementation=implementation, **kwargs)
    finally:
        LOADING.reset(token)
    loaded = model[0] if isinstance(model, tuple) else model
    modules = attention_modules(loaded)
    for module in modules:
        complete(module)
    _record(loaded, modules, mechanism, merged)
    return model


def _record(model: nn.Module, modules: list[nn.Module], mechanism: str, options: dict) -> None:
    """``config.kattn`` on the model's config and every config its attention modules read."""
    record = {"mechanism": mechanism, "options": dict(options)}
    configs = {id(c): c for c in [model.config, *(m.config for m in modules)]}
    for config in configs.values():
        setattr(config, CONFIG_KEY, record)


def check_options(mechanism: str, options: dict[str, Any]) -> None:
    """What :func:`use` refuses whatever the model: a mechanism that is not registered
    (``ValueError``), an option ``config.json`` cannot hold (``ValueError``) and the options
    the model gives (``TypeError``): ``dropout`` (the config's rate), ``head_dim``,
    ``num_heads`` and ``max_len`` (each layer's sizes)."""
    implementation_name(mechanism)
    _check_recordable(options)
    refuse_layer_options(options)


def _check_recordable(options: dict[str, Any]) -> None:
    """``ValueError`` naming an option that ``config.json`` cannot hold."""
    for name, value in options.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"option {name!r}: kattn.hf records the options in the model's config, so "
                f"they must be JSON values (numbers, strings, lists...), got "
                f"{type(value).__name__}"
            ) from None
