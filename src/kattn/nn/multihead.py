"""``kattn.MultiheadAttention``: a drop-in for ``torch.nn.MultiheadAttention`` calls."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import boolean
from ..registry import MECHANISMS, build


class MultiheadAttention(nn.Module):
    """Multi-head attention whose core is any registered kattn mechanism.

    Constructor and call follow ``torch.nn.MultiheadAttention`` (same parameter names, so its
    weights load directly), plus ``mechanism`` and that mechanism's options.

    Args:
        embed_dim, num_heads, dropout, bias, kdim, vdim, batch_first, device, dtype: as in
            ``torch.nn.MultiheadAttention``. ``dropout`` drops attention weights where the
            mechanism has such weights (softmax); elsewhere a warning says it is not applied.
        add_bias_kv, add_zero_attn: not supported (``NotImplementedError`` if True).
        mechanism: a name from ``kattn.available()``.
        max_len: longest sequence, for mechanisms whose parameters depend on it.
        out_proj: the linear layer after the concatenated heads. ``False`` drops it (the
            variants of Yorsh 2022, §4.2, not marked "-L"): the output is the concatenated
            heads, and the state dict has no ``out_proj`` weights.
        **options: options of the mechanism.
    """

    # PyTorch's fused encoder path reads this private flag to decide whether it may run the
    # layer without calling ``self_attn.forward``. False keeps it off, so that the kattn
    # mechanism always runs.
    _qkv_same_embed_dim = False

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        mechanism: str = "softmax",
        max_len: int | None = None,
        out_proj: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"
            )
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError(
                "add_bias_kv and add_zero_attn are not supported by kattn.MultiheadAttention"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        boolean("out_proj", out_proj)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.batch_first = batch_first
        self.dropout = dropout
        self.mechanism = mechanism
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self.shared_projection = self.kdim == embed_dim and self.vdim == embed_dim
        if self.shared_projection:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.use_out_proj = out_proj
        self.out_proj: nn.Module = (
            nn.Linear(embed_dim, embed_dim, bias=bias, **factory) if out_proj else nn.Identity()
        )
        pass_attention_dropout(options, mechanism, dropout)
        self.attention = build(
            mechanism, head_dim=self.head_dim, num_heads=num_heads, max_len=max_len, **options
        ).to(device=device)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        if isinstance(self.out_proj, nn.Linear) and self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(
        cls, module: nn.MultiheadAttention, *, mechanism: str, **options: Any
    ) -> MultiheadAttention:
        """A kattn module with ``module``'s configuration and a copy of its weights."""
        if module.bias_k is not None or module.add_zero_attn:
            raise NotImplementedError(
                "cannot convert a torch.nn.MultiheadAttention with add_bias_kv or add_zero_attn"
            )
        if options.get("out_proj", True) is not True:
            raise ValueError(
                "out_proj: a converted module keeps all of module's weights, its output "
                "projection included; build kattn.MultiheadAttention(..., out_proj=False) "
                "directly for a layer without one"
            )
        ref = module.out_proj.weight
        new = cls(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
            kdim=module.kdim,
            vdim=module.vdim,
            batch_first=module.batch_first,
            device=ref.device,
            dtype=ref.dtype,
            mechanism=mechanism,
            **options,
        )
        own = new.state_dict()  # keeps the mechanism's own buffers (random features)
        new.load_state_dict({**own, **module.state_dict()}, strict=True)
        return new.train(module.training)

    # ---------------------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        cu_seqlens: Tensor | Sequence[int] | None = None,
        cu_seqlens_k: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor, None]:
        """Attend like ``torch.nn.MultiheadAttention``; returns ``(output, None)``.

        ``key``/``value`` default to ``query``/``key``. ``key_padding_mask`` is ``(B, Lk)``,
        bool (True = padding) or float (0 / −inf). ``attn_mask`` may only be a causal mask (or
        use ``is_causal=True``); other masks raise ``NotImplementedError``.

        Packed sequences: with ``cu_seqlens = [0, L_1, L_1 + L_2, …, T]`` the inputs hold
        documents laid end to end in one sequence (unbatched, or a batch of one), and each
        document attends to itself alone (:meth:`kattn.Attention.forward_packed`);
        ``cu_seqlens_k`` delimits the key documents where they differ from the queries'.
        ``key_padding_mask`` is then not taken (a document is its own length).
        """
        if need_weights:
            raise NotImplementedError(
                "need_weights=True: kattn mechanisms do not form the attention-weight matrix; "
                "call with need_weights=False"
            )
        key = query if key is None else key
        value = key if value is None else value
        self_attention = key is query and value is query
        self._check_inputs(query, key, value)
        batched = query.dim() == 3
        if not batched:
            query, key, value = query[:, None], key[:, None], value[:, None]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]
        if self.batch_first and batched:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        # now (L, B, E)
        lq, b, _ = query.shape
        lk = key.shape[0]
        causal = is_causal or _is_causal_mask(attn_mask, lq, lk)
        mask = _as_bool_padding(key_padding_mask)
        _check_packed(cu_seqlens, cu_seqlens_k, mask, b)
        q, k, v = self._project(query, key, value, self_attention)
        heads = [
            x.reshape(x.shape[0], b, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
            for x in (q, k, v)
        ]
        if cu_seqlens is not None:
            hq, hk, hv = heads
            out = self.attention.forward_packed(
                hq, hk, hv, cu_seqlens, cu_seqlens_k=cu_seqlens_k, causal=causal
            )
        else:
            out = self.attention(*heads, causal=causal, key_padding_mask=mask)  # (B, H, Lq, Dh)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(lq, b, self.embed_dim))
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        return (out if batched else out[:, 0]), None

    def decode(self, x: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """Causal self-attention over new tokens ``x`` that follow ``state`` (None: none yet).

        ``x`` is ``(B, L, E)`` if ``batch_first`` else ``(L, B, E)``. One token goes through
        the mechanism's recurrent ``step``, several through its parallel ``prefill``; the
        outputs equal those of the causal forward over the whole sequence. Returns the output
        (the layout of ``x``) and the state after these tokens. Mechanisms without
        ``supports_recurrent`` raise ``NotImplementedError``.
        """
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise ValueError(f"x must be a 3-D tensor, got {getattr(x, 'shape', type(x))}")
        if x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have embed_dim={self.embed_dim} features (last dim), got {x.shape[-1]}"
            )
        if self.batch_first:
            x = x.transpose(0, 1)
        length, b, _ = x.shape
        q, k, v = self._project(x, x, x, True)
        q, k, v = (
            t.reshape(length, b, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
            for t in (q, k, v)
        )
        if length == 1 and state is not None:
            out, state = self.attention.step(q, k, v, state)
        else:
            out, state = self.attention.prefill(q, k, v, state)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(length, b, self.embed_dim))
        return (out.transpose(0, 1) if self.batch_first else out), state

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """``ValueError`` naming the input whose rank, feature size or batch is wrong."""
        dims = (("query", query, "embed_dim", self.embed_dim), ("key", key, "kdim", self.kdim),
                ("value", value, "vdim", self.vdim))  # fmt: skip
        for arg, x, name, size in dims:
            if not isinstance(x, Tensor) or x.is_nested or x.dim() not in (2, 3):
                raise ValueError(f"{arg} must be a 2-D or 3-D dense tensor")
            if x.shape[-1] != size:
                raise ValueError(
                    f"{arg} must have {name}={size} features (last dim), got {x.shape[-1]}"
                )
        if not query.dim() == key.dim() == value.dim():
            raise ValueError(
                f"query, key and value must all be batched (3-D) or all unbatched (2-D), got "
                f"{query.dim()}-D, {key.dim()}-D, {value.dim()}-D"
            )
        seq, batch = (1, 0) if self.batch_first and query.dim() == 3 else (0, 1)
        if query.dim() == 3 and not query.shape[batch] == key.shape[batch] == value.shape[batch]:
            raise ValueError(
                f"query, key and value must have the same batch size (dim {batch} with "
                f"batch_first={self.batch_first}), got {query.shape[batch]}, "
                f"{key.shape[batch]}, {value.shape[batch]}"
            )
        if key.shape[seq] != value.shape[seq]:
            raise ValueError(
                f"key and value must have the same length, got {key.shape[seq]} and "
                f"{value.shape[seq]}"
            )

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, self_attention: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        bias = self.in_proj_bias
        bq, bk, bv = (
            (None, None, None) if bias is None else (bias[:e], bias[e : 2 * e], bias[2 * e :])
        )
        if self.in_proj_weight is not None:
            w = self.in_proj_weight
            if self_attention:  # one matmul for the three projections
                return F.linear(query, w, bias).chunk(3, dim=-1)  # type: ignore[return-value]
            wq, wk, wv = w[:e], w[e : 2 * e], w[2 * e :]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"mechanism={self.mechanism!r}, batch_first={self.batch_first}"
            + ("" if self.use_out_proj else ", out_proj=False")
        )


def _check_packed(
    cu_seqlens: object, cu_seqlens_k: object, padding: Tensor | None, batch: int
) -> None:
    """``ValueError`` for packed-sequence arguments that cannot go together."""
    if cu_seqlens is None:
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k needs cu_seqlens (the query documents)")
        return
    if padding is not None:
        raise ValueError(
            "key_padding_mask with cu_seqlens: packed documents are their own lengths; pass "
            "one or the other"
        )
    if batch != 1:
        raise ValueError(
            f"cu_seqlens needs the documents packed into one sequence (unbatched, or a batch "
            f"of one), got a batch of {batch}"
        )


def _as_bool_padding(mask: Tensor | None) -> Tensor | None:
    """A bool (True = padding) version of a bool or additive float (0 / −inf) padding mask."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"key_padding_mask must be bool or float (0 / -inf), got {mask.dtype}")
    padding = torch.isneginf(mask)
    if not torch.all(padding | (mask == 0)):
        raise ValueError(
            "a float key_padding_mask may hold only 0 (keep) and -inf (padding); "
            "other additive biases are not supported"
        )
    return padding


def _is_causal_mask(attn_mask: Tensor | None, lq: int, lk: int) -> bool:
    """True for the causal pattern (bool True / float −inf strictly above the diagonal)."""
    if attn_mask is None:
        return False
    if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (lq, lk) and lq == lk:
        future = torch.ones(lq, lk, dtype=torch.bool, device=attn_mask.device).triu(1)
        if attn_mask.dtype == torch.bool:
            blocked = attn_mask
        elif attn_mask.is_floating_point() and torch.all(
            (attn_mask == 0) | torch.isneginf(attn_mask)
        ):
            blocked = torch.isneginf(attn_mask)
        else:
            blocked = None
        if blocked is not None and torch.equal(blocked, future):
            return True
    raise NotImplementedError(
        "attn_mask: only the causal mask is supported (or pass is_causal=True); kernelized "
        "mechanisms cannot apply an arbitrary (Lq, Lk) mask. Use key_padding_mask for padding."
    )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep


def pass_attention_dropout(
    options: dict[str, Any],
    mechanism: str,
    dropout: float,
    *,
    what: str = "dropout",
    where: str = "",
) -> None:
    """Hand attention-weight ``dropout`` to ``mechanism`` through its ``options`` (unless they
    set their own) where it has a weight matrix to drop (``supports_attention_dropout``);
    elsewhere warn at the user's line that ``what`` is not applied (``where``, if given,
    opens the message: the module it is about). Nothing for ``dropout`` 0."""
    if dropout <= 0:
        return
    if MECHANISMS.get(mechanism).cls.supports_attention_dropout:
        options.setdefault("dropout", dropout)
    else:
        warn_at_caller(
            f"{where}mechanism {mechanism!r} has no attention-weight matrix to drop out: "
            f"{what}={dropout} is not applied"
        )


def warn_at_caller(message: str) -> None:
    """``warnings.warn`` attributed to the first frame outside kattn: the user's line, whether
    the module was built there or by ``kattn.patch``, ``from_torch`` or a kattn model
    (``skip_file_prefixes`` does this from Python 3.12)."""
    frame = sys._getframe(1)
    level = 2  # the caller of this function
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    warnings.warn(message, stacklevel=level)
