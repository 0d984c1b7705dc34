"""The ``kattn:<name>`` attention implementations of transformers: their names and their
registration with ``AttentionInterface`` and ``AttentionMaskInterface``.

Each registered kattn mechanism becomes an implementation name that transformers accepts
wherever it takes ``attn_implementation`` (``from_pretrained``, ``set_attn_implementation``).
The name has no ``/`` so transformers does not take it for a kernel of the Hub.
"""

from __future__ import annotations

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..registry import MECHANISMS, available
from .attention import attention_forward
from .masks import kattn_mask
from .names import PREFIX


def implementation_name(mechanism: str) -> str:
    """``"kattn:<mechanism>"``, the ``attn_implementation`` of ``mechanism`` (registered with
    transformers on the way if it was registered with kattn after ``import kattn.hf``)."""
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise ValueError(
            f"mechanism must be one of kattn.available() ({', '.join(available())}), "
            f"got {mechanism!r}"
        )
    name = PREFIX + mechanism
    register(name)
    return name


def register(name: str) -> None:
    """Register implementation ``name`` with both interfaces of transformers (idempotent)."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, kattn_mask)


def register_all() -> list[str]:
    """Register ``kattn:<name>`` for every mechanism of ``kattn.available()``; returns them."""
    names = [PREFIX + mechanism for mechanism in available()]
    for name in names:
        register(name)
    return names
