"""What the linear-attention kernels share: importing Triton with the extra to install, where
kernels may run, block sizes, the accumulation dtype as a Triton type, the normaliser guard,
and the preparation of padded keys and of the causal-safe key offsets."""

from __future__ import annotations

import os

import torch
from torch import Tensor

from ...functional.numerics import accumulation_dtype, log_floor

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
    "acc_type",
    "block",
    "check_chunk",
    "check_device",
    "guard",
    "interpreted",
    "masked_keys",
    "running_offsets",
]

#: smallest side of a block that ``tl.dot`` takes.
MIN_BLOCK = 16
#: largest chunk of tokens the kernels hold at once (a C×C block of scores).
MAX_CHUNK = 128


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(x: Tensor) -> None:
    """Refuse tensors a kernel cannot read: CPU tensors outside the interpreter, and any
    device but CUDA and the CPU."""
    if x.device.type == "cuda" or (x.device.type == "cpu" and interpreted()):
        return
    raise ValueError(
        f"the Triton kernels run on CUDA tensors, or on CPU tensors with TRITON_INTERPRET=1 set "
        f"before triton is imported; got {x.device.type} tensors: use backend='torch' there"
    )


def check_chunk(chunk_size: int) -> None:
    """``ValueError`` unless ``chunk_size`` is a power of two in [16, 128]."""
    if (
        not isinstance(chunk_size, int)
        or not MIN_BLOCK <= chunk_size <= MAX_CHUNK
        or chunk_size & (chunk_size - 1)
    ):
        raise ValueError(
            f"chunk_size must be a power of two from {MIN_BLOCK} to {MAX_CHUNK} for the Triton "
            f"kernels, got {chunk_size!r}"
        )


def block(n: int) -> int:
    """The block side that holds ``n`` entries: a power of two of at least 16."""
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def acc_type(dtype: torch.dtype) -> tl.dtype:
    """The Triton type of the sums: fp64 for fp64 inputs, else fp32."""
    return tl.float64 if accumulation_dtype(dtype) == torch.float64 else tl.float32


@triton.jit
def guard(den, eps):
    """``|den| >= eps`` with its sign kept, as ``functional.numerics.guard_normaliser``."""
    return tl.where(den >= 0, tl.maximum(den, eps), tl.minimum(den, -eps))


def masked_keys(
    phi_k: Tensor, v: Tensor, s: Tensor | None, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Padded keys and values zeroed and their log-scales at the floor, by autograd-aware
    ``masked_fill`` (so padded positions get zero gradients and not even a NaN there reaches
    an output); the tensors made contiguous for the kernels."""
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
