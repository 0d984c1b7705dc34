"""``kattn.patch``: put a kattn mechanism in place of the attention of a model.

It reaches three kinds of attention: every ``torch.nn.MultiheadAttention`` (swapped for a
:class:`MultiheadAttention` with the same weights), the attention core of every x-transformers
``Attention`` (``patch_xtransformers``) and Hugging Face models whose attention goes through
transformers' attention interface (handed to ``kattn.hf``, ``patch_hf``). Anything else that
looks like attention is reported (``patch_report``): as a ``ValueError`` when nothing at all
could be replaced, as a warning beside what was replaced otherwise.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

from .multihead import MultiheadAttention, warn_at_caller
from .patch_hf import check_hf, find_hf_models, patch_hf
from .patch_report import Skipped, attention_like, listing
from .patch_xtransformers import (
    find_xtransformers,
    install,
    turn_off_kv_cache,
    xtransformers_core,
    xtransformers_refusals,
)

M = TypeVar("M", bound=nn.Module)


def patch(model: M, *, mechanism: str, **options: Any) -> M:
    """Run ``mechanism`` (built with ``options``) in place of every attention of ``model``.

    - ``torch.nn.MultiheadAttention``: replaced by :class:`MultiheadAttention`; the projections
      keep their weights, device, dtype, ``batch_first`` and training mode. A module used in
      several places is replaced once: all of them hold the same new module. PyTorch's fused
      encoder fast path and its nested-tensor conversion are turned off for the patched model,
      so the new mechanism really runs.
    - x-transformers ``Attention``: its core (``attend``) becomes the kattn mechanism, built
      for its heads and head size; projections, norms, gates and rotary embeddings stay as
      they are. Causality comes from the module, key padding from its ``mask`` (or
      ``context_mask``) argument. What the mechanism cannot honour (position biases on the
      logits such as ALiBi, talking heads, memory key/values, a normaliser other than
      softmax, cross-attention or causality the mechanism lacks) raises
      ``NotImplementedError`` listing each module and reason, before anything changes. Its
      key/value cache is turned off: generation recomputes the causal forward over the prefix.
    - Hugging Face ``PreTrainedModel``: handed to ``kattn.hf.use`` when its attention layers
      call transformers' attention interface; otherwise reported as not patched.

    Raises:
        ValueError: nothing could be replaced; the message lists the attention-like modules
            seen (by class name) and why each was left. When something was replaced and
            other attention-like modules were not, a ``UserWarning`` lists those instead.
        NotImplementedError: an x-transformers attention uses something the mechanism
            cannot honour (nothing has been changed).

    Every refusal (an x-transformers feature, an option ``kattn.hf`` cannot record in a
    config, a ``dropout`` or ``max_len`` option for a Hugging Face model, a ``head_dim`` or
    ``num_heads`` option, which each attention's own sizes give, an option a mechanism
    rejects) comes before any part of ``model`` is changed.

    Returns:
        ``model`` itself, changed in place (or the new module if ``model`` is itself a
        ``torch.nn.MultiheadAttention``).
    """
    _refuse_sizes(options)
    if isinstance(model, nn.MultiheadAttention):
        return MultiheadAttention.from_torch(model, mechanism=mechanism, **options)  # type: ignore[return-value]
    targets = find_xtransformers(model)
    cores = [xtransformers_core(t, mechanism, options) for t in targets]
    refused = [
        Skipped(t.name, type(t.module).__name__, why)
        for t, core in zip(targets, cores, strict=True)
        for why in xtransformers_refusals(t, mechanism, core)
    ]
    if refused:
        raise NotImplementedError(
            f"kattn.patch: mechanism {mechanism!r} cannot honour these x-transformers "
            f"attentions (nothing was changed):\n{listing(refused)}"
        )
    hf_models = find_hf_models(model)
    for _, hf in hf_models:
        check_hf(hf, mechanism, options)
    swapped = _swap_torch(model, mechanism, options)
    skipped: list[Skipped] = []
    delegated = []
    for name, hf in hf_models:
        left = patch_hf(name, hf, mechanism, options)  # empty: kattn.hf took the model
        skipped += left
        delegated += [] if left else [hf]
    for target, core in zip(targets, cores, strict=True):
        install(target, core)
    if targets:
        turn_off_kv_cache(model)
    handled = [*swapped, *(t.module for t in targets), *(hf for _, hf in hf_models)]
    skipped += attention_like(model, handled=handled)
    if not (swapped or targets or delegated):
        raise ValueError(_nothing_replaced(model, skipped))
    if skipped:
        warn_at_caller(
            f"kattn.patch left these attention-like modules as they were:\n{listing(skipped)}"
        )
    return model


def _refuse_sizes(options: dict[str, Any]) -> None:
    """``TypeError`` for a ``head_dim`` or ``num_heads`` option: each mechanism is sized by
    the attention it replaces."""
    for name in ("head_dim", "num_heads"):
        if name in options:
            raise TypeError(
                f"{name}: kattn.patch sizes each mechanism by the attention it replaces (its "
                f"heads and head size); leave {name} out of the options"
            )


def _swap_torch(model: nn.Module, mechanism: str, options: dict[str, Any]) -> list[nn.Module]:
    """Replace every ``torch.nn.MultiheadAttention``; returns the new modules. They are all
    built before the first is put in place, so an option one of them refuses changes nothing."""
    # one new module per torch module: every place that held a shared (tied) module holds
    # the same new one, so its weights stay shared
    swapped: dict[int, MultiheadAttention] = {}
    places: list[tuple[nn.Module, str, int]] = []
    for parent in list(model.modules()):
        # parent._modules, not named_children(): that skips a child already seen in another
        # slot of the same parent
        for name, child in list(parent._modules.items()):
            if isinstance(child, nn.MultiheadAttention):
                if id(child) not in swapped:
                    swapped[id(child)] = MultiheadAttention.from_torch(
                        child, mechanism=mechanism, **options
                    )
                places.append((parent, name, id(child)))
    for parent, name, key in places:
        setattr(parent, name, swapped[key])
    for parent in model.modules():
        if isinstance(parent, nn.TransformerEncoder):
            # otherwise padded inputs become nested tensors before reaching the layers
            parent.use_nested_tensor = False
    return list(swapped.values())


def _nothing_replaced(model: nn.Module, skipped: list[Skipped]) -> str:
    """The message of the ``ValueError`` when nothing could be replaced."""
    message = (
        "kattn.patch: the model has no torch.nn.MultiheadAttention, x-transformers Attention "
        "or Hugging Face attention it could replace; attention-like modules seen:\n"
        + listing(skipped)
    )
    if any(isinstance(m, MultiheadAttention) for m in model.modules()):
        message += (
            "\nThe model already runs kattn.MultiheadAttention modules: change their mechanism "
            "with kattn.convert_attention(model, to=...)."
        )
    return message
