"""Module-owned seeded randomness: the one contract of the mechanisms whose pattern is drawn at
random (random blocks, hash rotations and directions, key samples, k-means starts).

The contract, stated once here and kept by every class that mixes in :class:`SeededDraws`:

- **Module-owned generator.** Every draw comes from a ``torch.Generator`` seeded from the
  module's ``seed``, the draw number and the draw's key (lengths, number of buckets, causal
  flag …), never from torch's global RNG, so no other code moves it and it moves no other code.
- **Eval fixed.** In ``eval()`` the module uses draw 0 for a key, the same on every call.
- **Training redraw.** Each training forward takes the next draw (1, 2, … of a sequence fixed
  by the seed).
- **Checkpoint reuse.** The forward that activation checkpointing re-runs inside backward
  takes the draw of the forward it recomputes, so its gradients are those of that forward.
- **Seed and draws in ``state_dict()``.** They are the module's extra state: a reloaded module
  has the same eval draws and continues the same sequence of training draws.
- **Independent of batch composition.** A draw is shared by every item of a batch (it depends
  on no tensor), so an example's output does not depend on the rest of its batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from ..checks import int_at_least
from ..extra_state import INT64_MAX, counters_from_state, counters_to_tensor
from ..features.base import in_backward

_T = TypeVar("_T")

#: eval draws kept per module (one per key and device).
_CACHED_DRAWS = 8


class SeededDraws:
    """Mixin for an :class:`~kattn.attention.base.Attention` whose pattern is drawn at random
    (see the module docstring for the contract). List it before ``Attention`` in the bases, set
    ``draw_stream`` (the name that keeps two mechanisms' streams apart at one seed) and call
    :meth:`_init_seeded` in ``__init__`` after ``super().__init__``.

    A subclass takes ``draw`` from :meth:`_current_draw` in its forward and 0 in its eval
    accessors and reference, and makes the draw from ``self._generator(draw, *key)``, or
    through :meth:`_drawn`, which keeps the eval draw.
    """

    #: the name mixed into every generator seed (different mechanisms, unrelated streams).
    draw_stream: ClassVar[str]
    training: bool
    seed: int

    def _init_seeded(self, seed: int) -> None:
        self.seed = int_at_least("seed", seed, 0)
        if seed > INT64_MAX:  # the extra state keeps it in an int64
            raise ValueError(f"seed must be below 2**63, got {seed!r}")
        self._draws = 0  # training draws so far
        self._eval_draws: dict[tuple[Hashable, ...], Any] = {}

    def _generator(self, draw: int, *key: int) -> torch.Generator:
        """A CPU generator for draw ``draw`` (0 for eval) of this key: its seed is 63 bits of
        a hash of the stream, the module's seed, the draw and the key, so that nearby
        arguments give unrelated streams."""
        text = "/".join(str(part) for part in (self.draw_stream, self.seed, draw, *key))
        digest = hashlib.sha256(text.encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)

    def _current_draw(self) -> int:
        """0 in eval; in training the next draw, or the same one again when activation
        checkpointing re-runs the forward inside backward."""
        if not self.training:
            return 0
        if not in_backward():
            self._draws += 1
        return self._draws

    def _drawn(
        self, key: tuple[int, ...], draw: int, device: Any, make: Callable[[torch.Generator], _T]
    ) -> _T:
        """``make(generator)`` for draw ``draw`` of ``key``; draw 0 (eval) is made once per key
        and device and kept (the oldest of more than a few is dropped; a new seed or state
        empties the cache). For draws that depend on no tensor."""
        if draw:
            return make(self._generator(draw, *key))
        cache_key = (self.seed, *key, str(torch.device(device or "cpu")))
        if cache_key not in self._eval_draws:
            if len(self._eval_draws) >= _CACHED_DRAWS:
                self._eval_draws.pop(next(iter(self._eval_draws)))
            self._eval_draws[cache_key] = make(self._generator(0, *key))
        result: _T = self._eval_draws[cache_key]
        return result

    def _drawn_normal(
        self, shape: tuple[int, ...], key: tuple[int, ...], draw: int, device: Any
    ) -> Tensor:
        """:meth:`_drawn` of i.i.d. N(0, 1) entries of ``shape``, drawn in float64 on the CPU
        (the same numbers on every device) and moved to ``device``."""
        return self._drawn(
            key,
            draw,
            device,
            lambda generator: torch.randn(shape, generator=generator, dtype=torch.float64).to(
                device
            ),
        )

    def get_extra_state(self) -> Tensor:
        """The seed and the number of training draws, ``[seed, draws]`` as an ``int64`` tensor
        (see :mod:`kattn.extra_state`): a reloaded module has the same eval draws and continues
        the same sequence of training draws."""
        return counters_to_tensor([self.seed, self._draws])

    def set_extra_state(self, state: Any) -> None:
        """Restore the seed and draws that :meth:`get_extra_state` (or an older checkpoint's
        dict ``{"seed": int, "draws": int}``) recorded."""
        self.seed, self._draws = counters_from_state(state, ["seed", "draws"])
        self._eval_draws.clear()
