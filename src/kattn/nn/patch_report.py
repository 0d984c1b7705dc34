"""What ``kattn.patch`` saw but did not replace: attention-like modules and the reason for each."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

_ATTENTION_LIKE = re.compile(r"attention|attn|attend", re.IGNORECASE)

UNKNOWN_MODULE = (
    "kattn.patch knows torch.nn.MultiheadAttention, x-transformers' Attention and Hugging Face "
    "models; it does not know how this module projects and combines its heads, so it cannot "
    "put a kattn mechanism in its place (wrap its heads with kattn.build(...) by hand)"
)


@dataclass(frozen=True)
class Skipped:
    """One attention-like module ``kattn.patch`` left as it was.

    Attributes:
        name: its qualified name in the model ("" for the model itself).
        kind: its class name.
        reason: a sentence saying why it was not replaced.
    """

    name: str
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name or '(model)'} ({self.kind}): {self.reason}"


def attention_like(
    model: nn.Module, *, handled: Iterable[nn.Module], reason: str = UNKNOWN_MODULE
) -> list[Skipped]:
    """The modules of ``model`` whose class name says attention and that nothing handled.

    A module counts when its class name contains "attention", "attn" or "attend", it is not
    inside a ``handled`` module (replaced, or part of a model handed elsewhere), it holds no
    handled module (a container such as a Transformer layer) and no other attention-like
    module (the innermost one is reported). Each is reported with ``reason``.
    """
    handled_ids = {id(m) for m in handled}
    named = list(model.named_modules())
    marks = [name for name, m in named if id(m) in handled_ids]
    found: list[Skipped] = []
    for name, module in named:
        inside = any(not h or name == h or name.startswith(h + ".") for h in marks)
        holder = any(h.startswith(name + ".") or not name for h in marks)
        if inside or holder or id(module) in handled_ids:
            continue
        if _ATTENTION_LIKE.search(type(module).__name__) and not _is_kattn(module):
            found.append(Skipped(name, type(module).__name__, reason))
    # the innermost ones: BertAttention holds BertSelfAttention, which says more
    return [s for s in found if not any(o.name.startswith(s.name + ".") for o in found)]


def _is_kattn(module: nn.Module) -> bool:
    """Modules of kattn itself (an already patched model) are not reported."""
    return type(module).__module__.split(".")[0] == "kattn"


def listing(skipped: Iterable[Skipped]) -> str:
    """One line per class and reason (the first name and how many more), or a sentence
    saying there was none."""
    groups: dict[tuple[str, str], list[str]] = {}
    for s in skipped:
        groups.setdefault((s.kind, s.reason), []).append(s.name or "(model)")
    lines = []
    for (kind, reason), names in groups.items():
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        lines.append(f"  - {names[0]}{more} ({kind}): {reason}")
    return "\n".join(lines) if lines else "  (no module whose class name says attention)"
