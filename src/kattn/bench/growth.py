"""How the time of one call grows with the sequence length L, read from the complexity each
mechanism registers (``kattn.spec(name).complexity``).

The text before the first ``;`` is the cost of a whole call (what follows is decoding or
memory). Each ``O(...)`` term in it that is not a memory figure counts: the call grows like
the largest, or like the smallest where the text says the faster of two paths is taken
("whichever is faster"). A term grows like L² when it holds ``L²`` or ``Lq·Lk``, like L
(times log L where it says so) when it holds L at all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_QUADRATIC = re.compile(r"L²|L\^2|Lq\s*·\s*Lk|Lk\s*·\s*Lq")
_LENGTH = re.compile(r"(?<![A-Za-z])L[qk]?(?![A-Za-z²^])")
_LOG_LENGTH = re.compile(r"log\s*L(?![A-Za-z])")


@dataclass(frozen=True, order=True)
class Growth:
    """``O(L^power)``, times ``log L`` when ``log``."""

    power: int
    log: bool = False

    def describe(self) -> str:
        base = {0: "1", 1: "L", 2: "L²"}.get(self.power, f"L^{self.power}")
        return f"O({base}{' log L' if self.log else ''})"

    def scale(self, start: int, end: int) -> float:
        """How many times longer a call at length ``end`` takes than one at ``start``."""
        factor = (end / start) ** self.power
        return factor * (math.log(end) / math.log(start) if self.log else 1.0)


def _terms(text: str) -> list[tuple[str, str]]:
    """Every ``O(...)`` of ``text`` (balanced brackets) with the text that follows it."""
    found = []
    for match in re.finditer(r"\bO\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        found.append((text[match.end() : end], text[end + 1 :]))
    return found


def time_growth(complexity: str) -> Growth | None:
    """The growth in L of one call's time stated by ``complexity`` (None: no term in L)."""
    cost = complexity.split(";")[0]
    growths = []
    for term, after in _terms(cost):
        quadratic = bool(_QUADRATIC.search(term))
        if re.match(r"\s*memory", after) or not (quadratic or _LENGTH.search(term)):
            continue
        power = 2 if quadratic else 1
        growths.append(Growth(power, power == 1 and bool(_LOG_LENGTH.search(term))))
    if not growths:
        return None
    return min(growths) if "whichever is faster" in cost else max(growths)
