"""Feature maps φ: the base class and the registry behind ``kernelized(feature_map=...)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..checks import is_positive_int
from ..extra_state import counters_from_state, counters_to_tensor
from ..registry import FEATURE_MAPS, caller_module


class Features(NamedTuple):
    """Features in log-space friendly form: ``φ(x) = values · exp(log_scale)``.

    Attributes:
        values: ``(B, H, L, M)``, bounded (at most 1 in absolute value for the built-in maps).
        log_scale: ``(B, H, L)`` per-row log factor, or None when it is 0 everywhere.
    """

    values: Tensor
    log_scale: Tensor | None

    def dense(self) -> Tensor:
        """The plain features ``φ(x)`` (may overflow where ``log_scale`` is large)."""
        if self.log_scale is None:
            return self.values
        return self.values * torch.exp(self.log_scale)[..., None]


class FeatureMap(nn.Module):
    """A map φ: ``(B, H, L, D) → (B, H, L, M)`` with ``κ(x, y) ≈ φ(x)·φ(y)``.

    ``forward(x, scale)`` returns the :class:`Features` of ``√scale · x`` (maps fold the scale
    into their own arithmetic where that saves a pass over x); inputs arrive in fp32 or fp64.
    """

    #: every feature is >= 0, so normalisers are positive.
    positive: bool = True
    #: φ(x)·φ(y) estimates exp(x·y): kernelized attention then scales inputs like softmax.
    approximates_softmax: bool = False
    #: kernelized attention scales q and k like softmax's logits by default (``q·k/√D``):
    #: the maps that estimate ``exp(x·y)`` and the learned spectral maps.
    softmax_scaling: bool = False
    #: constructor arguments that a registered name fixes (not options a user may pass).
    fixed_options: tuple[str, ...] = ()
    #: the map draws random parameters (see :meth:`redraw_features`).
    is_random: bool = False

    def __init__(self, *, head_dim: int, num_heads: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = num_heads

    @property
    def num_features(self) -> int:
        """M, the number of features."""
        raise NotImplementedError

    def forward(self, x: Tensor, scale: float = 1.0) -> Features:
        raise NotImplementedError

    def query_values(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``φ(√scale · x)`` up to a positive factor per row: all a query needs, since that
        factor cancels in the ratio of kernelized attention."""
        return self(x, scale).values

    def features(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """The plain ``φ(√scale · x)`` (for references and plots)."""
        return self(x, scale).dense()

    def training_step(self) -> None:
        """Called once per training forward of the owning attention (redraw schedules)."""

    def regularization_loss(self) -> Tensor:
        """Penalty on the map's parameters (0 unless the map defines one)."""
        tensors = [*self.parameters(), *self.buffers()]
        return torch.zeros((), device=tensors[0].device if tensors else None)


class ResampledFeatureMap(FeatureMap):
    """A feature map with random draws that are renewed every ``every`` training forwards.

    Subclasses implement :meth:`_redraw` (replace, never overwrite, the buffers holding the
    draws, so graphs of earlier forwards still waiting for their backward keep theirs). Draws
    are frozen in ``eval()`` and in recurrent steps (only training forwards call
    :meth:`training_step`); the forward that activation checkpointing re-runs inside backward
    is the same step again and keeps them too.
    """

    is_random = True

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        every: str | int,
        option: str,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if every != "never" and not is_positive_int(every):
            raise ValueError(f"{option} must be 'never' or a positive int, got {every!r}")
        self._every = every
        self.generator = generator
        self._steps_since_redraw = 0

    @property
    def every(self) -> str | int:
        """The schedule: ``"never"`` or N training forwards between draws."""
        return self._every

    def _redraw(self) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Draw fresh random parameters now (same devices and dtypes)."""
        self._redraw()
        self._steps_since_redraw = 0

    def get_extra_state(self) -> Tensor:
        """The position in the redraw schedule, ``[steps_since_redraw]`` as an ``int64``
        tensor (see :mod:`kattn.extra_state`), kept in ``state_dict()`` so that a resumed run
        redraws at the same steps as an uninterrupted one."""
        return counters_to_tensor([self._steps_since_redraw])

    def set_extra_state(self, state: Any) -> None:
        """Restore the position that :meth:`get_extra_state` (or an older checkpoint's dict
        ``{"steps_since_redraw": int}``) recorded."""
        (self._steps_since_redraw,) = counters_from_state(state, ["steps_since_redraw"])

    @torch.compiler.disable
    def training_step(self) -> None:
        if not isinstance(self._every, int) or in_backward():  # "never"; a checkpoint re-run
            return
        self._steps_since_redraw += 1
        if self._steps_since_redraw >= self._every:
            self.redraw_features()


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass in this thread."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def replace_buffer(module: nn.Module, name: str, value: Tensor) -> None:
    """Set buffer ``name`` to ``value`` on the old buffer's device and dtype."""
    old = getattr(module, name)
    setattr(module, name, value.to(device=old.device, dtype=old.dtype))


def register_feature_map(
    name: str, cls: type[FeatureMap], defaults: Mapping[str, Any] | None = None
) -> None:
    """Register ``cls`` (with preset ``defaults``) as ``feature_map=name``."""
    FEATURE_MAPS.register(name, cls, defaults, module=caller_module())


def available() -> list[str]:
    """Registered feature-map names, sorted."""
    return FEATURE_MAPS.available()


def get(name: str) -> type[FeatureMap]:
    """The class registered as ``name`` (``ValueError`` naming the valid ones otherwise)."""
    return FEATURE_MAPS.get(name).cls


def option_names(name: str) -> list[str]:
    """The options feature map ``name`` accepts."""
    return FEATURE_MAPS.option_names(name) or []


def build(name: str, *, head_dim: int, num_heads: int, **options: Any) -> FeatureMap:
    """Build feature map ``name``; unknown options, and bool or number options of another
    type, raise ``TypeError`` naming the option."""
    return FEATURE_MAPS.build(name, head_dim=head_dim, num_heads=num_heads, **options)
