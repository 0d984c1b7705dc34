"""Implementation names of kattn in transformers: ``"kattn:<mechanism>"``."""

from __future__ import annotations

#: What an implementation name of kattn starts with (no ``/``: transformers reads names with
#: one as kernels of the Hub).
PREFIX = "kattn:"


def mechanism_of(implementation: object) -> str | None:
    """The kattn mechanism of an ``attn_implementation`` value, None if it is not kattn's."""
    if isinstance(implementation, str) and implementation.startswith(PREFIX):
        return implementation[len(PREFIX) :]
    return None
