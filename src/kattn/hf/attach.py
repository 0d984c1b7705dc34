"""kattn modules inside the attention modules of a transformers model.

Every attention module of transformers that dispatches through ``AttentionInterface`` gets
one kattn :class:`~kattn.Attention` as its submodule ``kattn``, sized by the model (query
heads, head dim, ``max_len = config.max_position_embeddings``), so the mechanism's own
tensors (random features, learned spectra, relative-position tables) are in the model's
``state_dict`` and in what ``save_pretrained`` writes. A forward pre-hook on the module hands
the call's cache to the attention function (see :mod:`kattn.hf.cache`).
"""

from __future__ import annotations

import inspect
import math
import warnings
from contextvars import ContextVar
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, EncoderDecoderCache

from ..attention.base import Attention
from ..registry import build
from .cache import prepare_layer
from .names import PREFIX, mechanism_of

#: The attribute of each attention module that holds its kattn module.
ATTRIBUTE = "kattn"
#: The config attribute recording the mechanism and options (written by save_pretrained).
CONFIG_KEY = "kattn"
_DISPATCH = "ALL_ATTENTION_FUNCTIONS.get_interface("


_DISPATCHING: dict[type, bool] = {}


def _dispatches(cls: Any) -> bool:
    """Whether ``cls.forward`` picks its attention function from ``AttentionInterface``."""
    if cls not in _DISPATCHING:
        try:
            _DISPATCHING[cls] = _DISPATCH in inspect.getsource(inspect.unwrap(cls.forward))
        except (OSError, TypeError):
            _DISPATCHING[cls] = False
    return _DISPATCHING[cls]


def is_attention_module(module: nn.Module) -> bool:
    """Whether ``module`` is an attention module of transformers that a ``kattn:<name>``
    implementation runs (its forward dispatches through ``AttentionInterface``)."""
    return hasattr(module, "config") and _dispatches(type(module))


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules of ``model`` (see :func:`is_attention_module`), in order."""
    return [m for m in model.modules() if is_attention_module(m)]


def layer_sizes(module: Any) -> tuple[int, int, int | None]:
    """``(num_heads, head_dim, max_len)`` of an attention module: its query heads, its head
    dimension and the config's ``max_position_embeddings`` (None if the config has none)."""
    config = module.config
    heads = getattr(module, "num_heads", None) or getattr(module, "num_attention_heads", None)
    heads = heads or config.num_attention_heads
    head_dim = getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)
    head_dim = head_dim or getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(heads), int(head_dim), getattr(config, "max_position_embeddings", None)


def recorded_options(config: Any, mechanism: str) -> dict[str, Any]:
    """The options ``config`` records for ``mechanism`` (none if it records another)."""
    record = getattr(config, CONFIG_KEY, None)
    if isinstance(record, dict) and record.get("mechanism") == mechanism:
        return dict(record.get("options") or {})
    return {}


#: Options :func:`build_for` takes from the attention layer and its config instead.
LAYER_SIZES = ("head_dim", "num_heads", "max_len")


def refuse_layer_options(options: dict[str, Any]) -> None:
    """``TypeError`` if ``options`` set what the model gives: ``dropout`` (the config's rate)
    or a size of the layer (``head_dim``, ``num_heads``, ``max_len``)."""
    if "dropout" in options:
        raise TypeError(
            "dropout: kattn.hf takes the attention dropout of the model's config (the rate "
            "transformers passes to the attention function), not an option"
        )
    for name in LAYER_SIZES:
        if name in options:
            raise TypeError(
                f"{name}: kattn.hf sizes each kattn module from its attention layer (its "
                "query heads and head size, and max_len = the config's "
                f"max_position_embeddings); leave {name} out of the options"
            )


class Built(NamedTuple):
    """A kattn module made by :func:`build_for` for an attention module.

    Attributes:
        attn: the kattn module.
        follows_scaling: whether it takes the model's scaling of the logits, set on it now
            and followed at each call (:func:`kattn.hf.attention.follow_scaling`).
    """

    attn: Attention
    follows_scaling: bool


def build_for(
    module: nn.Module, mechanism: str, options: dict[str, Any], *, device: Any = None
) -> Built:
    """The kattn module of ``mechanism`` for attention module ``module`` (see the module
    docstring), in the dtype of ``module``'s parameters and on ``device`` (theirs by default).

    A mechanism whose scale is softmax's default ``1/√D`` (softmax, performer, ...) and that
    ``options`` give no scale follows the model's: HF's ``scaling`` (``module.scaling``)
    becomes its ``scale`` when it differs from ``1/√D``, and the attention function then
    follows the scaling each call passes. Mechanisms with a kernel of their own keep their
    scale (with a warning when the model's scaling is not ``1/√D``).
    """
    heads, head_dim, max_len = layer_sizes(module)
    refuse_layer_options(options)
    attn = build(mechanism, head_dim=head_dim, num_heads=heads, max_len=max_len, **options)
    follows = follows_scaling(attn, options)
    scaling = getattr(module, "scaling", None)
    if scaling is not None and not math.isclose(float(scaling), head_dim**-0.5, rel_tol=1e-12):
        if follows:
            # read at each forward, as the option would be: nothing else depends on it
            cast(Any, attn).scale = float(scaling)
        else:
            warnings.warn(
                f"the model scales attention logits by {float(scaling):.4g}, not "
                f"1/sqrt(head_dim); mechanism {mechanism!r} has a kernel of its own and keeps "
                "its scale",
                stacklevel=3,
            )
    reference = next(module.parameters(), None)
    dtype = reference.dtype if reference is not None else None
    device = device if device is not None else (reference.device if reference is not None else None)
    return Built(attn.to(device=device, dtype=dtype), follows)


def follows_scaling(attn: Attention, options: dict[str, Any]) -> bool:
    """Whether ``attn``, just built with ``options``, takes the model's scaling of the
    logits: ``options`` set no scale and ``attn`` scales ``q·k`` by softmax's default
    ``1/√D`` (``scale`` None means it)."""
    if "scale" in options or not hasattr(attn, "scale"):
        return False
    scale: Any = cast(Any, attn).scale
    return scale is None or math.isclose(float(scale), attn.head_dim**-0.5, rel_tol=1e-9)


def attach(module: Any, mechanism: str, options: dict[str, Any], **kwargs: Any) -> Attention:
    """Build ``module``'s kattn module (:func:`build_for`) and :func:`install` it; returns
    it."""
    return install(module, build_for(module, mechanism, options, **kwargs), mechanism, options)


def install(module: Any, built: Built, mechanism: str, options: dict[str, Any]) -> Attention:
    """Set the kattn module that :func:`build_for` made with ``mechanism`` and ``options`` as
    ``module.kattn`` and install the pre-hook; returns it. Built on the meta device (a model
    that transformers is about to load), it is :func:`complete` d at the first forward, if
    not before."""
    attn = built.attn.train(module.training)
    setattr(module, ATTRIBUTE, attn)
    module._kattn_follows_scaling = built.follows_scaling
    module._kattn_mechanism = mechanism
    module._kattn_options = dict(options)
    module._kattn_pending = any(t.is_meta for t in _tensors(attn))
    install_hooks(module)
    return attn


def complete(module: Any) -> None:
    """Initialise what loading did not fill in ``module``'s kattn module, built on the meta
    device: the tensors transformers did not mark as loaded (``_is_hf_initialized``: those a
    checkpoint without kattn lacks, and non-persistent buffers) get the values of a freshly
    built module, in place, so the parameter objects (and an optimizer holding them) stay."""
    if not getattr(module, "_kattn_pending", False):
        return
    old = getattr(module, ATTRIBUTE)
    fresh = build_for(module, module._kattn_mechanism, module._kattn_options).attn
    if any(t.is_meta for t in _tensors(old)):  # never loaded: nothing to keep
        setattr(module, ATTRIBUTE, fresh.train(module.training))
    else:
        new = dict(_named_tensors(fresh))
        with torch.no_grad():
            for name, tensor in _named_tensors(old):
                if not getattr(tensor, "_is_hf_initialized", False):
                    tensor.copy_(new[name])
    module._kattn_pending = False


def _named_tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def _tensors(module: nn.Module) -> list[Tensor]:
    return [t for _, t in _named_tensors(module)]


def module_attention(module: Any) -> Attention:
    """The kattn module of attention module ``module`` for the model's implementation,
    built now (with the options ``module.config`` records) if it has none yet."""
    mechanism = mechanism_of(module.config._attn_implementation)
    if mechanism is None:
        raise ValueError(
            f"the config's attn_implementation is {module.config._attn_implementation!r}, "
            f"not one of kattn's ({PREFIX}<name>)"
        )
    if getattr(module, ATTRIBUTE, None) is None:
        return attach(module, mechanism, recorded_options(module.config, mechanism))
    if getattr(module, "_kattn_mechanism", None) != mechanism:
        raise ValueError(
            f"this model's kattn modules run {getattr(module, '_kattn_mechanism', '?')!r} but "
            f"its attn_implementation is {PREFIX}{mechanism}: switch mechanisms with "
            f"kattn.hf.use(model, {mechanism!r})"
        )
    complete(module)
    return getattr(module, ATTRIBUTE)


def install_hooks(module: Any) -> None:
    """The forward pre-hook and hook that give the attention function the call's cache."""
    if getattr(module, "_kattn_hooked", False):
        return
    module.register_forward_pre_hook(_pre_forward, with_kwargs=True)
    module.register_forward_hook(_post_forward)
    module._kattn_hooked = True


def _pre_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if mechanism_of(module.config._attn_implementation) is None:
        return
    attn = module_attention(module)
    cache = find_cache(args, kwargs)
    layer_idx = getattr(module, "layer_idx", None)
    module._kattn_decoded = 0
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
        if not getattr(module, "is_causal", False) and layer_idx is not None:
            # a cross-attention runs after its layer's self-attention has counted the new
            # tokens: the queries of this call are the last of these
            module._kattn_decoded = cache.get_seq_length(layer_idx)
    module._kattn_cache = cache
    # in training a forward goes through the mechanism's forward (its redraw schedule,
    # dropout) and the keys stay in HF's cache; in eval a recurrent state replaces them
    recurrent = attn.supports_recurrent and getattr(module, "is_causal", False)
    recurrent = recurrent and not module.training
    if cache is not None and recurrent and layer_idx is not None:
        prepare_layer(cache, layer_idx)


def find_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Cache | None:
    """The cache an attention module's forward is given, under any name (``cache``,
    ``past_key_values``, GPT-NeoX's ``layer_past``, ...) or position."""
    for value in (*kwargs.values(), *args):
        if isinstance(value, Cache):
            return value
    return None


def _post_forward(module: Any, args: Any, output: Any) -> None:
    module._kattn_cache = None


#: ``(mechanism, options)`` that :func:`on_register` builds with instead of those the config
#: records (set by ``kattn.hf.from_pretrained`` while it loads).
LOADING: ContextVar[tuple[str, dict[str, Any]] | None] = ContextVar(
    "kattn_hf_loading", default=None
)


def on_register(parent: nn.Module, name: str, child: Any) -> None:
    """The module-registration hook ``import kattn.hf`` installs (PyTorch's
    ``register_module_module_registration_hook``): an attention module of a model being built with a
    ``kattn:<name>`` implementation gets its kattn module at once (with the options of
    :data:`LOADING`, else those the config records), so that ``from_pretrained`` fills its
    tensors from the checkpoint like the model's own."""
    config = getattr(child, "config", None)
    mechanism = mechanism_of(getattr(config, "_attn_implementation", None))
    if mechanism is None or not isinstance(child, nn.Module) or not is_attention_module(child):
        return
    if getattr(child, ATTRIBUTE, None) is not None:
        return
    loading = LOADING.get()
    if loading is not None and loading[0] == mechanism:
        options = loading[1]
    else:
        options = recorded_options(config, mechanism)
    attach(child, mechanism, options)
