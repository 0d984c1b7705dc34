"""Decoding with a constant-size recurrent state instead of a growing key/value cache.

:class:`RecurrentLayer` is a cache layer of transformers that keeps, for one attention layer,
the state of a kattn mechanism with ``supports_recurrent`` (``Attention.init_state``): the
prompt is read with ``Attention.prefill`` and each new token with ``Attention.step``, so the
memory and time per token do not grow with the context (for kernelized mechanisms; softmax's
state is its key/value cache). Its ``update`` returns only the new keys and values, which the
attention function then feeds to the state.

``model.generate()`` makes a ``DynamicCache``; the pre-hook of :mod:`kattn.hf.attach` puts a
:class:`RecurrentLayer` in place of each of its empty layers whose attention is recurrent, so
nothing has to be passed. :class:`RecurrentCache` is the same as a cache of its own.

Padded keys count nowhere: a batch whose prompt has padding keeps one state per sequence,
each of which reads only that sequence's real tokens (the outputs at padded positions are 0).
Sequences with the same padding (all the unpadded ones, for one) read the prompt in one
prefill. The sequences' states are then stacked into the batch's state when they can be
(tensors of the same shapes: the fixed-size states of kernelized mechanisms, key/value
caches of the same length), so that each decoding step reads the whole batch in one call;
states that cannot (key/value caches of different lengths) are stepped one sequence at a
time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, StaticLayer

from ..attention.base import Attention


class RecurrentLayer(CacheLayerMixin):
    """One attention layer's recurrent decoding state (see the module docstring).

    Args:
        sliding_window: the window of a sliding-window layer it replaces (the chunk size of
            chunked attention, whose cache layer is one too): decoding past it raises (a
            recurrent state cannot forget the keys that leave the window or chunk).
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, sliding_window: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.sliding_window = sliding_window
        self.is_initialized = True
        self.seen = 0
        #: the batch's state, or one state per sequence (a list) once a key was padded.
        self.state: Any = None
        #: whether a forward over packed documents went through: the state then holds none
        #: of them, and decoding from it is refused.
        self.packed = False

    # ------------------------------------------------------------- the cache layer of HF
    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        """Count the new tokens and return their keys and values (the attention function
        feeds them to the state: :meth:`attend`)."""
        self.seen += key_states.shape[-2]
        if self.sliding_window is not None and self.seen > self.sliding_window:
            raise NotImplementedError(
                f"decoding past the sliding window or attention chunk ({self.sliding_window} "
                "tokens): a recurrent kattn state cannot drop the keys that leave it"
            )
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def offload(self) -> None:
        """Nothing to move: the state stays where the model is."""

    def prefetch(self) -> None:
        """Nothing to move: the state stays where the model is."""

    def reset(self) -> None:
        self.seen = 0
        self.state = None
        self.packed = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError(
                "a recurrent state cannot drop tokens it has read (crop): decode with a "
                "DynamicCache for assisted generation"
            )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        self._select(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is None:
            return
        if isinstance(self.state, list):
            self.state = [_map(s, torch.clone) for s in self.state for _ in range(repeats)]
        else:
            self.state = _map(self.state, lambda x: x.repeat_interleave(repeats, dim=0))

    def _select(self, indices: Tensor) -> None:
        if self.state is None:
            return
        if isinstance(self.state, list):
            self.state = [_map(self.state[int(i)], torch.clone) for i in indices]
        else:
            self.state = _map(self.state, lambda x: x.index_select(0, indices.to(x.device)))

    # ------------------------------------------------------------------------- decoding
    def attend(
        self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None
    ) -> Tensor:
        """Causal attention of the new tokens ``q, k (B, H, L, D)``, ``v (B, H, L, Dv)``
        after those the state holds, updating it; ``padding (B, L)`` (True = padded) marks
        new keys that must count nowhere (None when none is, as
        :func:`kattn.hf.masks.key_padding_mask` gives it)."""
        if not attn.supports_recurrent:
            raise NotImplementedError(
                f"{type(attn).__name__} has no recurrent form: decode it with a DynamicCache "
                "(the default of generate), not a RecurrentCache"
            )
        if self.packed:
            raise NotImplementedError(
                "this cache went through a forward over packed documents, whose state it does "
                "not keep: decode each document in a row of its own"
            )
        per_sequence = isinstance(self.state, list)
        if not per_sequence and padding is None:
            out, self.state = _read(attn, q, k, v, self.state)
            return out
        if not per_sequence:
            self.state = _split(self.state, q.shape[0])
        # the states may stack only after this call split them or read a prompt into them
        restack = not per_sequence or q.shape[2] > 1 or any(s is None for s in self.state)
        out = q.new_zeros(*q.shape[:3], v.shape[-1])
        for keep, rows in _rows_by_keys(padding, q.shape[0], q.shape[2]).items():
            if not keep:
                continue
            if len(rows) > 1 and all(self.state[b] is None for b in rows):
                # sequences with the same padding read the prompt together (one prefill)
                self._read_rows(attn, q, k, v, out, rows, list(keep))
                continue
            for b in rows:
                self._read_rows(attn, q, k, v, out, [b], list(keep))
        if restack:
            self.state = _stack(self.state)
        return out

    def _read_rows(
        self,
        attn: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        rows: list[int],
        keep: list[int],
    ) -> None:
        """Read the keys ``keep`` of the sequences ``rows`` (all with no state yet, or one)
        into their states, writing their outputs into ``out``."""
        if len(rows) == 1 and len(keep) == q.shape[2]:
            # one sequence, every key kept (each step of per-sequence states): slices
            b = rows[0]
            out_b, self.state[b] = _read(
                attn, q[b : b + 1], k[b : b + 1], v[b : b + 1], self.state[b]
            )
            out[b : b + 1] = out_b.to(out.dtype)
            return
        self._read_rows_indexed(attn, q, k, v, out, rows, keep)

    def _read_rows_indexed(
        self,
        attn: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        rows: list[int],
        keep: list[int],
    ) -> None:
        """:meth:`_read_rows` for any ``rows`` and ``keep``, by index tensors."""
        index = torch.tensor(rows, device=q.device)
        cols = torch.tensor(keep, device=q.device)
        qb, kb, vb = (x.index_select(0, index).index_select(2, cols) for x in (q, k, v))
        state = self.state[rows[0]] if len(rows) == 1 else None
        out_b, state = _read(attn, qb, kb, vb, state)
        block = out.index_select(0, index)
        block[:, :, cols] = out_b.to(out.dtype)
        out.index_copy_(0, index, block)
        for i, b in enumerate(rows):
            self.state[b] = state if len(rows) == 1 else _map(state, _row(i))


def _rows_by_keys(
    padding: Tensor | None, batch: int, length: int
) -> dict[tuple[int, ...], list[int]]:
    """The sequences of a batch grouped by the positions of their real (unpadded) keys."""
    groups: dict[tuple[int, ...], list[int]] = {}
    rows = [[True] * length] * batch if padding is None else (~padding).tolist()
    for b, row in enumerate(rows):
        keep = tuple(i for i, real in enumerate(row) if real)
        groups.setdefault(keep, []).append(b)
    return groups


def _read(attn: Attention, q: Tensor, k: Tensor, v: Tensor, state: Any) -> tuple[Tensor, Any]:
    """``step`` for one token after a state, ``prefill`` otherwise."""
    if state is not None and q.shape[2] == 1:
        return attn.step(q, k, v, state)
    return attn.prefill(q, k, v, state)


def _split(state: Any, batch: int) -> list[Any]:
    """One state per sequence (None for each when nothing was read yet)."""
    if state is None:
        return [None] * batch
    return [_map(state, _row(b)) for b in range(batch)]


def _stack(states: list[Any]) -> Any:
    """The batch's state made of one state per sequence, when every sequence's state has
    the same tensor shapes and the same other values (each step then reads the whole batch
    at once); the list as it is otherwise (a sequence with no state yet, key/value caches
    of different lengths)."""
    leaves = [_leaves(s) for s in states]
    if any(s is None for s in states) or any(len(x) != len(leaves[0]) for x in leaves):
        return states
    for column in zip(*leaves, strict=True):
        first = column[0]
        if isinstance(first, Tensor):
            same = all(isinstance(x, Tensor) and x.shape == first.shape for x in column)
            if not same or first.dim() == 0:
                return states
        elif any(isinstance(x, Tensor) or x != first for x in column):
            return states
    return _zip(states, lambda xs: torch.cat(xs, dim=0))


def _leaves(state: Any) -> list[Any]:
    """The tensors and other values of a (nested) state, in order (containers' kinds too,
    so that states of different structures differ)."""
    if isinstance(state, (tuple, list)):
        return [type(state), len(state)] + [y for x in state for y in _leaves(x)]
    if isinstance(state, dict):
        return [dict, tuple(state)] + [y for x in state.values() for y in _leaves(x)]
    return [state]


def _zip(states: list[Any], fn: Callable[[list[Tensor]], Tensor]) -> Any:
    """``fn`` applied to the tensors at each place of states of the same structure."""
    first = states[0]
    if isinstance(first, Tensor):
        return fn(states)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_zip(list(xs), fn) for xs in zip(*states, strict=True)))
    if isinstance(first, (tuple, list)):
        return type(first)(_zip(list(xs), fn) for xs in zip(*states, strict=True))
    if isinstance(first, dict):
        return {key: _zip([s[key] for s in states], fn) for key in first}
    return first


def _row(b: int) -> Callable[[Tensor], Tensor]:
    return lambda x: x[b : b + 1].clone()


def _map(state: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` applied to every tensor of a (nested) state; other values kept."""
    return _zip([state], lambda xs: fn(xs[0]))


class RecurrentCache(Cache):
    """A cache of :class:`RecurrentLayer` s, one per attention layer (made as layers are
    reached): pass it as ``cache=`` (or ``past_key_values=``) to a forward or to
    ``generate`` of a model whose attention is a recurrent kattn mechanism."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=RecurrentLayer)


def prepare_layer(cache: Cache, layer_idx: int) -> None:
    """Make layer ``layer_idx`` of ``cache`` a :class:`RecurrentLayer` if it is an empty
    dynamic layer (or not made yet); a layer that holds keys already is left as it is (the
    attention function then reads its keys), and a static layer is refused."""
    layers = cache.layers
    if layer_idx >= len(layers):
        if cache.layer_class_to_replicate is None:
            return
        while len(layers) < layer_idx:
            layers.append(cache.layer_class_to_replicate())
        layers.append(RecurrentLayer())
        return
    layer = layers[layer_idx]
    if isinstance(layer, StaticLayer):
        raise NotImplementedError(
            "kattn.hf decodes with a DynamicCache or a RecurrentCache, not a static cache "
            "(cache_implementation='static'): its fixed-size key buffers are what a recurrent "
            "state replaces"
        )
    dynamic = type(layer) is DynamicLayer or hasattr(layer, "sliding_window")
    if dynamic and isinstance(layer, DynamicLayer) and layer.get_seq_length() == 0:
        window = getattr(layer, "sliding_window", None)
        layers[layer_idx] = RecurrentLayer(sliding_window=window)
