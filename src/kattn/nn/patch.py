"""``kattn.patch``: swap every ``torch.nn.MultiheadAttention`` of a model for a kattn one."""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

from .multihead import MultiheadAttention

M = TypeVar("M", bound=nn.Module)


def patch(model: M, *, mechanism: str, **options: Any) -> M:
    """Replace every ``torch.nn.MultiheadAttention`` in ``model`` by :class:`MultiheadAttention`.

    The projections keep their weights, device, dtype, ``batch_first`` and training mode;
    only the attention core changes to ``mechanism`` (built with ``options``). PyTorch's fused
    encoder fast path and its nested-tensor conversion are turned off for the patched model, so
    the new mechanism really runs.

    Returns:
        ``model`` itself, changed in place (or the new module if ``model`` is itself a
        ``torch.nn.MultiheadAttention``).
    """
    if isinstance(model, nn.MultiheadAttention):
        return MultiheadAttention.from_torch(model, mechanism=mechanism, **options)  # type: ignore[return-value]
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                setattr(
                    parent,
                    name,
                    MultiheadAttention.from_torch(child, mechanism=mechanism, **options),
                )
                swapped += 1
        if isinstance(parent, nn.TransformerEncoder):
            # otherwise padded inputs become nested tensors before reaching the layers
            parent.use_nested_tensor = False
    if swapped == 0:
        raise ValueError("kattn.patch: the model has no torch.nn.MultiheadAttention to replace")
    return model
