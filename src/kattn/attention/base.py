"""The :class:`Attention` base class: capability flags, input validation, recurrent API."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from ..checks import boolean, positive_int, positive_int_or_none
from ..functional.numerics import autocast_off
from ..registry import CAPABILITY_FLAGS, check_option_types, declared_types, keyword_parameters
from .packed import packed_forward

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Flags of how a query's output row is formed, given by :meth:`Attention.capabilities` with
#: the capability flags (``kattn.spec`` does not list them): a key/value cache hands a
#: mechanism fewer queries than the full forward, which gives each of them the same row
#: only where these are False (``kattn.hf`` refuses the rest there).
ROW_FLAGS = ("rows_depend_on_other_queries", "rows_depend_on_position")


_M = TypeVar("_M", bound=Callable[..., Any])


def sums_in_float32(method: _M) -> _M:
    """Run an attention method with autocast disabled: the features, sums and normalisers
    are computed in the accumulation dtype (fp32 for half precision), as the contract says,
    also inside ``torch.autocast`` regions (whose bf16 products would round running sums and
    signed normalisers)."""

    @functools.wraps(method)
    def wrapper(self: Any, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        with autocast_off(x):
            return method(self, x, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Attention(nn.Module):
    """Base class of every kattn mechanism.

    ``forward(q, k, v, causal=False, key_padding_mask=None)`` takes already projected heads,
    q ``(B, H, Lq, D)``, k ``(B, H, Lk, D)``, v ``(B, H, Lk, Dv)``, and returns
    ``(B, H, Lq, Dv)`` in the input dtype. ``key_padding_mask`` is ``(B, Lk)`` bool with True
    marking padding. Subclasses implement ``_attend`` (and ``_step`` when recurrent) and
    ``_reference``, the dense form behind :meth:`reference`; the base class validates inputs
    and refuses what the capability flags rule out.
    """

    supports_causal: bool = True
    supports_padding_mask: bool = True
    supports_cross: bool = True
    supports_recurrent: bool = False
    is_exact: bool = False
    #: whether ``max_len`` bounds the lengths this module accepts.
    limits_length: bool = False
    #: whether the mechanism implements dropout of attention weights (a ``dropout`` option).
    supports_attention_dropout: bool = False
    #: whether a query's output row depends on the other queries of the call (buckets,
    #: clusters, landmarks or a selection built from all of them), not only on that query,
    #: its position and the keys.
    rows_depend_on_other_queries: bool = False
    #: whether a query's output row depends on the query's position (a relative-position
    #: encoding, logits indexed by position), not only on the query and the keys.
    rows_depend_on_position: bool = False

    def __init__(self, *, head_dim: int, num_heads: int, max_len: int | None = None) -> None:
        super().__init__()
        positive_int("head_dim", head_dim)
        positive_int("num_heads", num_heads)
        positive_int_or_none("max_len", max_len)
        if self.limits_length and max_len is None:
            raise ValueError(f"{type(self).__name__} needs max_len (its parameters depend on it)")
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.max_len = max_len

    # ----------------------------------------------------------------- class-level description
    @classmethod
    def capabilities(cls, **options: Any) -> dict[str, bool]:
        """Capability flags (and :data:`ROW_FLAGS`) of an instance built with ``options``
        (class defaults here)."""
        return {flag: bool(getattr(cls, flag)) for flag in (*CAPABILITY_FLAGS, *ROW_FLAGS)}

    @classmethod
    def option_names(cls, options: Mapping[str, Any]) -> list[str] | None:
        """Valid option names given the (merged) ``options``; None if the class checks itself."""
        return keyword_parameters(cls.__init__, exclude=("head_dim", "num_heads", "max_len"))

    @classmethod
    def option_types(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The declared type of each option given the (merged) ``options``, from the
        annotations of ``__init__``: ``kattn.build`` refuses bool and float options of another
        type with a ``TypeError`` naming the option."""
        return declared_types(cls.__init__, exclude=("head_dim", "num_heads", "max_len"))

    def _check_option_types(self, **options: Any) -> None:
        """``TypeError`` for any of ``options`` whose value does not have the type declared
        in this class's ``__init__`` (for modules constructed without ``kattn.build``)."""
        check_option_types(type(self).__name__, options, type(self).option_types(options))

    def _set_capabilities(self, **options: Any) -> None:
        for flag, value in self.capabilities(**options).items():
            setattr(self, flag, value)

    # ------------------------------------------------------------------------------ forward
    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Attend; see the class docstring for shapes."""
        self.check_inputs(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
        return self._attend(q, k, v, causal=causal, key_padding_mask=key_padding_mask)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        raise NotImplementedError

    #: attend over packed documents (FlashAttention's ``cu_seqlens``): see
    #: :func:`~kattn.attention.packed.packed_forward`.
    forward_packed = packed_forward

    def reference(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """The output of :meth:`forward` by the slow, explicit O(Lq·Lk) path, for checking the
        fast one: dense matrices, explicit masks and normalisers, the parameters, random
        features and landmarks the module holds now.

        Inputs are validated as by :meth:`forward`. The result is the evaluation-mode output
        (no dropout, no sampling noise, no feature redraw, nothing recorded): the module's
        training flags are switched off while it runs and restored afterwards, so calling it
        changes no state. Gradients flow to q, k, v and the parameters. Shapes as in the class
        docstring; memory grows with Lq·Lk, so keep lengths moderate.
        """
        self.check_inputs(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
        with _evaluation_mode(self):
            return self._reference(q, k, v, causal=causal, key_padding_mask=key_padding_mask)

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} has no dense reference: implement "
            "_reference(q, k, v, *, causal, key_padding_mask) with the explicit O(Lq·Lk) form "
            "of its _attend"
        )

    def regularization_loss(self) -> Tensor:
        """Penalty the training loop adds to the loss (0 for mechanisms without one)."""
        tensors = [*self.parameters(), *self.buffers()]
        return torch.zeros((), device=tensors[0].device if tensors else None)

    # ---------------------------------------------------------------------------- recurrent
    def init_state(
        self,
        batch_size: int,
        num_heads: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Any:
        """The empty decoding state for ``step`` (mechanisms with ``supports_recurrent``)."""
        self._require_recurrent()
        if num_heads != self.num_heads:
            raise ValueError(
                f"num_heads: this module was built for {self.num_heads} heads, got {num_heads}"
            )
        positive_int("batch_size", batch_size)
        return self._init_state(batch_size, device=device, dtype=dtype or torch.float32)

    def step(self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        """One causal decoding step: q_t, k_t ``(B, H, 1, D)``, v_t ``(B, H, 1, Dv)``.

        Returns the output ``(B, H, 1, Dv)`` and the new state; the outputs of successive steps
        equal the causal forward over the same tokens.
        """
        self._require_recurrent()
        self.check_inputs(q_t, k_t, v_t, causal=True, key_padding_mask=None, check_length=False)
        if q_t.shape[2] != 1:
            raise ValueError(f"step takes one token: q_t must be (B, H, 1, D), got {_shape(q_t)}")
        return self._step(q_t, k_t, v_t, state)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """Causal attention over L new tokens that follow ``state`` (a fresh state if None),
        in parallel form: q, k ``(B, H, L, D)``, v ``(B, H, L, Dv)``.

        Returns the output ``(B, H, L, Dv)`` (equal to the causal forward when ``state`` is
        fresh) and the state after the L tokens, from which :meth:`step` continues. This is how
        a prompt is read before decoding: O(L) chunkwise work, not L separate steps.
        """
        self._require_recurrent()
        self.check_inputs(q, k, v, causal=True, key_padding_mask=None, check_length=False)
        if state is None:
            acc = torch.float64 if q.dtype == torch.float64 else torch.float32
            state = self.init_state(q.shape[0], q.shape[1], device=q.device, dtype=acc)
        return self._prefill(q, k, v, state)

    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Token by token through :meth:`_step`; families with a parallel form override it."""
        outs = []
        for t in range(q.shape[2]):
            out, state = self._step(
                q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state
            )
            outs.append(out)
        return torch.cat(outs, dim=2), state

    def _init_state(self, batch_size: int, *, device: Any, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def _step(self, q_t: Tensor, k_t: Tensor, v_t: Tensor, state: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def _require_recurrent(self) -> None:
        if not self.supports_recurrent:
            raise NotImplementedError(
                f"{type(self).__name__} has no recurrent form (supports_recurrent is False): "
                "decode by running the causal forward over the whole prefix instead"
            )

    # ---------------------------------------------------------------------------- validation
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
        """Raise ``ValueError`` / ``NotImplementedError`` for anything this module cannot do."""
        for arg, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, Tensor):
                raise ValueError(f"{arg} must be a torch.Tensor, got {type(x).__name__}")
            if x.dim() != 4:
                raise ValueError(f"{arg} must be 4-D (B, H, L, D), got shape {_shape(x)}")
            if x.dtype not in _FLOATS:
                raise ValueError(
                    f"{arg} must be a floating tensor (fp16/bf16/fp32/fp64), got {x.dtype}"
                )
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        (bq, hq, lq, dq), (bk, hk, lk, dk), (bv, hv, lv, _) = q.shape, k.shape, v.shape
        if not (bq == bk == bv):
            raise ValueError(f"batch sizes differ: q {bq}, k {bk}, v {bv}")
        if not (hq == hk == hv):
            raise ValueError(f"head counts differ: q {hq}, k {hk}, v {hv}")
        if hq != self.num_heads:
            raise ValueError(
                f"q/k/v have {hq} heads but this module was built with num_heads={self.num_heads}"
            )
        if lk != lv:
            raise ValueError(f"k and v must have the same length, got {lk} and {lv}")
        if lq == 0 or lk == 0:
            raise ValueError(f"q and k need at least one position each, got Lq={lq}, Lk={lk}")
        if dq != dk:
            raise ValueError(f"q and k must have the same head dim, got {dq} and {dk}")
        if dq != self.head_dim:
            raise ValueError(
                f"q/k head dim is {dq} but this module was built with head_dim={self.head_dim}"
            )
        boolean("causal", causal)
        if causal:
            if not self.supports_causal:
                raise NotImplementedError(
                    f"{type(self).__name__} does not support causal attention"
                    f"{self._why_not('causal')}"
                )
            if lq != lk:
                raise ValueError(f"causal attention needs Lq == Lk, got Lq={lq}, Lk={lk}")
        if lq != lk and not self.supports_cross:
            raise NotImplementedError(
                f"{type(self).__name__} does not support cross-attention (Lq={lq} != Lk={lk})"
                f"{self._why_not('cross')}"
            )
        too_long = self.max_len is not None and max(lq, lk) > self.max_len
        if check_length and self.limits_length and too_long:
            raise ValueError(
                f"sequence length {max(lq, lk)} exceeds max_len={self.max_len} given to build"
            )
        if key_padding_mask is not None:
            if not self.supports_padding_mask:
                raise NotImplementedError(
                    f"{type(self).__name__} does not support key_padding_mask"
                    f"{self._why_not('padding')}"
                )
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
                got = (
                    key_padding_mask.dtype
                    if isinstance(key_padding_mask, Tensor)
                    else type(key_padding_mask).__name__
                )
                raise ValueError(
                    f"key_padding_mask must be a bool tensor (True = padding), got {got}"
                )
            if tuple(key_padding_mask.shape) != (bk, lk):
                raise ValueError(
                    f"key_padding_mask must have shape (B, Lk) = ({bk}, {lk}), "
                    f"got {_shape(key_padding_mask)}"
                )

    def _set_dropout(self, dropout: float) -> None:
        """Validate and store the attention-dropout probability (mechanisms with
        ``supports_attention_dropout``)."""
        check_option_types(type(self).__name__, {"dropout": dropout}, {"dropout": float})
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)

    @property
    def dropout_p(self) -> float:
        """The dropout probability to apply now: ``dropout`` in training, 0 in eval."""
        return getattr(self, "dropout", 0.0) if self.training else 0.0

    def _why_not(self, capability: str) -> str:
        """An optional ': reason' suffix for refusal messages (subclasses override)."""
        return ""


@contextmanager
def _evaluation_mode(module: nn.Module) -> Iterator[None]:
    """Run with every submodule in ``eval()``; each one's own flag is restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.train(False)
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)
