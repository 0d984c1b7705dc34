"""The part of an attention that its relative positional encoding decides: whether it decodes
step by step and attends across lengths (the encoding's flags), the lengths it accepts, and
why a capability is missing. Shared by kernelized attention and softmax with a bias."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..aggregator import Aggregator
from ..positional import RelativePositionBias
from .base import Attention
from .rpe_options import aggregator_class


class EncodedAttention(Attention):
    """An attention whose ``rpe`` option (a name, a module or None) sets ``supports_recurrent``
    and ``supports_cross``; subclasses say which module holds the encoding (:meth:`_encoding`)."""

    def _encoding(self) -> Aggregator | None:
        """The module whose lengths and flags apply (None: no encoding)."""
        raise NotImplementedError

    @classmethod
    def capabilities(cls, **options: Any) -> dict[str, bool]:
        """The class flags, with ``supports_recurrent`` and ``supports_cross`` those of the
        encoding that ``rpe`` gives; with an encoding, a query's row depends on its position
        (each key is weighed by its offset from the query)."""
        encoding = aggregator_class(options.get("rpe"))
        flags = super().capabilities(**options)
        flags["supports_recurrent"] = bool(encoding.supports_recurrent)
        flags["supports_cross"] = bool(encoding.supports_cross)
        flags["rows_depend_on_position"] = issubclass(encoding, RelativePositionBias)
        return flags

    def check_inputs(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        causal: bool,
        key_padding_mask: Tensor | None,
        check_length: bool = True,
    ) -> None:
        super().check_inputs(
            q, k, v, causal=causal, key_padding_mask=key_padding_mask, check_length=check_length
        )
        encoding = self._encoding()
        if check_length and encoding is not None:
            encoding.check_lengths(q.shape[2], k.shape[2])

    def _why_not(self, capability: str) -> str:
        encoding = self._encoding()
        if capability == "cross" and encoding is not None and not encoding.supports_cross:
            return f": its relative positional encoding ({type(encoding).__name__}) needs Lq == Lk"
        return ""
