"""What the kernels share: importing Triton with the extra to install, the checks of their
inputs, block sizes, the accumulation dtype as a Triton type and ``tl.dot``'s precision, the
normaliser guard, and the preparation of padded keys and of the causal-safe key offsets."""

from __future__ import annotations

import torch
from torch import Tensor

from ...functional.numerics import accumulation_dtype, log_floor
from .placement import check_device

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised where triton is absent
    raise ImportError(
        "the Triton kernels need triton: pip install 'kattn[gpu]' (or pip install triton)"
    ) from error

__all__ = [
    "MAX_CHUNK",
    "MIN_BLOCK",
    "NO_OFFSET",
    "SCAN_STAGES",
    "acc_type",
    "block",
    "check_chunk",
    "checked_inputs",
    "dot_precision",
    "guard",
    "masked_keys",
    "running_offsets",
    "scan_tiles",
]

#: smallest side of a block that ``tl.dot`` takes.
MIN_BLOCK = 16
#: largest chunk of tokens the kernels hold at once (a C×C block of scores).
MAX_CHUNK = 128
#: a log-offset below every real one but far from overflow when shifted (``−∞`` would give
#: ``−∞ − (−∞) = NaN`` where a row sees no key at all).
NO_OFFSET = -1e30
#: software-pipelining stages of the kernels that scan a sequence chunk by chunk. Triton's
#: default (3) keeps three chunks of every loaded tile in shared memory, which at M = 256
#: features needs more than any GPU has (378,376 B for the causal forward in fp32 against
#: 166,912 B on sm_80); one stage holds one.
SCAN_STAGES = 1


def check_chunk(size: int, name: str = "chunk_size") -> None:
    """``ValueError`` unless ``size`` (the argument ``name``) is a power of two in [16, 128]."""
    if not isinstance(size, int) or not MIN_BLOCK <= size <= MAX_CHUNK or size & (size - 1):
        raise ValueError(
            f"{name} must be a power of two from {MIN_BLOCK} to {MAX_CHUNK} for the Triton "
            f"kernels, got {size!r}"
        )


def checked_inputs(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, k_log_scale: Tensor | None
) -> Tensor | None:
    """The key log-scales in the accumulation dtype, after refusing (``ValueError``) tensors
    a kernel cannot read and shapes other than ``phi_q`` ``(B, H, Lq, M)``, ``phi_k``
    ``(B, H, Lk, M)``, ``v`` ``(B, H, Lk, Dv)`` and ``k_log_scale`` ``(B, H, Lk)``."""
    check_device(v)
    (b, h, _, m), (bk, hk, lk, mk) = phi_q.shape, phi_k.shape
    if (b, h, m) != (bk, hk, mk) or phi_k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"phi_q must be (B, H, Lq, M), phi_k (B, H, Lk, M) and v (B, H, Lk, Dv), got "
            f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}"
        )
    if k_log_scale is None:
        return None
    if k_log_scale.shape != (b, h, lk):
        raise ValueError(
            f"k_log_scale must be (B, H, Lk) = {(b, h, lk)}, got {tuple(k_log_scale.shape)}"
        )
    return k_log_scale.to(accumulation_dtype(v.dtype))


def block(n: int) -> int:
    """The block side that holds ``n`` entries: a power of two of at least 16."""
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def scan_tiles(
    m: int, dv: int, chunk: int, max_value_block: int | None = None
) -> tuple[int, int, int]:
    """The chunk and the feature and value blocks ``(C, BM, BDV)`` of a scanning kernel over
    ``m`` features and ``dv`` value columns (at most ``max_value_block`` per program), with
    the chunk lowered as the ``BM × BDV`` state grows, so that the kernels at ``M <= 256`` and
    ``Dv <= 128`` fit the shared memory of sm_80 with fp32 or half inputs; fp64 tiles take
    twice the bytes and fit only smaller states, to which the dispatch holds fp64
    (:func:`~kattn.ops.triton.sizes.checked_sizes`; ``tests/ops/test_triton_shared_memory.py``
    compiles both). The chunk changes how the sums are grouped, not what they are."""
    bm, bdv = block(m), block(dv)
    if max_value_block is not None:
        bdv = min(bdv, max_value_block)
    state = bm * bdv
    cap = 64 if state <= 64 * 64 else 32 if state <= 128 * 128 else MIN_BLOCK
    return min(chunk, cap), bm, bdv


def acc_type(dtype: torch.dtype) -> tl.dtype:
    """The Triton type of the sums: fp64 for fp64 inputs, else fp32."""
    return tl.float64 if accumulation_dtype(dtype) == torch.float64 else tl.float32


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision of sums for outputs of ``dtype``: IEEE products for fp32 and fp64
    outputs, TF32 (exact on fp16/bf16 inputs, rounding fp32 sums to 10 bits) for half
    precision."""
    return "tf32" if dtype in (torch.float16, torch.bfloat16) else "ieee"


@triton.jit
def guard(den, eps):
    """``|den| >= eps`` with its sign kept, as ``functional.numerics.guard_normaliser``."""
    return tl.where(den >= 0, tl.maximum(den, eps), tl.minimum(den, -eps))


def masked_keys(
    phi_k: Tensor,
    v: Tensor,
    s: Tensor | None,
    key_padding_mask: Tensor | None,
    *,
    log_scales: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Padded keys and values zeroed and their log-scales at the floor, by autograd-aware
    ``masked_fill`` (so padded positions get zero gradients and not even a NaN there reaches
    an output); the tensors made contiguous for the kernels. ``log_scales``: keys without
    log-scales get them (0), for the positional kernels, whose parts and rows carry units
    of their own: a padded key, or a part without keys (filled in at the floor), must not
    set the units in which the normaliser is guarded."""
    if s is None and log_scales:
        s = phi_k.new_zeros(phi_k.shape[:3], dtype=accumulation_dtype(v.dtype))
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]  # (B, 1, Lk)
        phi_k = phi_k.masked_fill(pad[..., None], 0.0)
        v = v.masked_fill(pad[..., None], 0.0)
        if s is not None:
            s = s.masked_fill(pad, log_floor(s.dtype))
    return phi_k.contiguous(), v.contiguous(), None if s is None else s.contiguous()


def running_offsets(s: Tensor, start: Tensor | None = None) -> Tensor:
    """``r_i = max(start, max_{j<=i} s_j)`` ``(B, H, L)``: the key offset of query i, which
    never looks at a later key (``start`` ``(B, H)``: the offset of an earlier state). It
    cancels in the ratio, so it carries no gradient."""
    r = torch.cummax(s.detach(), dim=-1).values
    if start is not None:
        r = torch.maximum(r, start.to(r.dtype)[..., None])
    return r.contiguous()
