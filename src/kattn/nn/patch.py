"""``kattn.patch``: swap every ``torch.nn.MultiheadAttention`` of a model for a kattn one."""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

from .multihead import MultiheadAttention

M = TypeVar("M", bound=nn.Module)


def patch(model: M, *, mechanism: str, **options: Any) -> M:
    """Replace every ``torch.nn.MultiheadAttention`` in ``model`` by :class:`MultiheadAttention`.

    The projections keep their weights, device, dtype, ``batch_first`` and training mode;
    only the attention core changes to ``mechanism`` (built with ``options``). A module used
    in several places is replaced once: all of them hold the same new module. PyTorch's fused
    encoder fast path and its nested-tensor conversion are turned off for the patched model, so
    the new mechanism really runs.

    Returns:
        ``model`` itself, changed in place (or the new module if ``model`` is itself a
        ``torch.nn.MultiheadAttention``).
    """
    if isinstance(model, nn.MultiheadAttention):
        return MultiheadAttention.from_torch(model, mechanism=mechanism, **options)  # type: ignore[return-value]
    # one new module per torch module: every place that held a shared (tied) module holds
    # the same new one, so its weights stay shared
    swapped: dict[int, tuple[nn.Module, MultiheadAttention]] = {}
    for parent in list(model.modules()):
        # parent._modules, not named_children(): that skips a child already seen in another
        # slot of the same parent
        for name, child in list(parent._modules.items()):
            if isinstance(child, nn.MultiheadAttention):
                if id(child) not in swapped:
                    new = MultiheadAttention.from_torch(child, mechanism=mechanism, **options)
                    swapped[id(child)] = (child, new)
                setattr(parent, name, swapped[id(child)][1])
        if isinstance(parent, nn.TransformerEncoder):
            # otherwise padded inputs become nested tensors before reaching the layers
            parent.use_nested_tensor = False
    if not swapped:
        raise ValueError("kattn.patch: the model has no torch.nn.MultiheadAttention to replace")
    return model
