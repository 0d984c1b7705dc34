"""Nyströmformer: softmax attention by the Nyström method with segment-mean landmarks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import positive_int
from ..functional.numerics import zero_padded
from ..functional.nystrom import (
    nystromformer_attention,
    nystromformer_attention_reference,
    nystromformer_conv_skip,
    nystromformer_conv_skip_reference,
)
from ..functional.softmax import softmax_attention, softmax_attention_reference
from ..registry import register_mechanism
from .base import Attention

#: the pseudo-inverse starts that converge for Nyströmformer's middle kernel (a softmax matrix,
#: not close to I: from Z₀ = I the iteration diverges on it)
PINV_INITS = ("per_matrix", "global")


class NystromformerAttention(Attention):
    """``softmax(Q K̃ᵀ) pinv(softmax(Q̃ K̃ᵀ)) softmax(Q̃ Kᵀ) V`` (Xiong et al., AAAI 2021).

    Landmarks are segment means of the queries and keys (any L: the last segments take one
    token more); padded keys count nowhere (key landmarks, third kernel), and with Lq == Lk
    padded positions are left out of the query landmarks. When both lengths are at most
    ``num_landmarks`` the result is exact softmax attention, computed directly (as the
    released code does).

    Args:
        num_landmarks: m (128 in the Skyformer paper's LRA comparison).
        pinv_iterations: hyper-power iterations (6); pinv_init: ``"per_matrix"`` or the
            released ``"global"`` (Skyformer's ``"identity"`` needs ``‖I − M‖ < 1``, which
            a softmax kernel does not meet).
        conv_kernel_size: optional depthwise convolution of the values along the sequence,
            added to the output (35 in the Nyströmformer LRA runs; None = off).
    """

    supports_causal = False
    rows_depend_on_other_queries = True  # landmarks: segment means of the queries

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        max_len: int | None = None,
        num_landmarks: int = 128,
        pinv_iterations: int = 6,
        pinv_init: str = "per_matrix",
        conv_kernel_size: int | None = None,
    ) -> None:
        super().__init__(head_dim=head_dim, num_heads=num_heads, max_len=max_len)
        positive_int("num_landmarks", num_landmarks)
        positive_int("pinv_iterations", pinv_iterations)
        if pinv_init not in PINV_INITS:
            raise ValueError(
                f"pinv_init must be one of {PINV_INITS}, got {pinv_init!r} (the identity start "
                "converges only when ‖I − M‖ < 1, which Nyströmformer's softmax kernel does not "
                "meet)"
            )
        if conv_kernel_size is not None and (
            isinstance(conv_kernel_size, bool)
            or not isinstance(conv_kernel_size, int)
            or conv_kernel_size < 1
            or conv_kernel_size % 2 == 0
        ):
            raise ValueError(
                f"conv_kernel_size must be None or a positive odd int, got {conv_kernel_size!r}"
            )
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self.pinv_init = pinv_init
        self.conv_kernel_size = conv_kernel_size
        self.conv: nn.Parameter | None = None
        if conv_kernel_size is not None:
            # one 1-D filter per head along the sequence, shared by the value channels
            weight = torch.empty(num_heads, 1, conv_kernel_size, 1)
            nn.init.kaiming_uniform_(weight, a=5**0.5)
            self.conv = nn.Parameter(weight)

    def _why_not(self, capability: str) -> str:
        if capability == "causal":
            return (
                ": its landmarks are means over segments of the whole sequence, so every "
                "output would depend on future tokens"
            )
        return ""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        lq, lk = q.shape[2], k.shape[2]
        k, v = zero_padded(key_padding_mask, k, v)
        if max(lq, lk) <= self.num_landmarks:
            out = softmax_attention(q, k, v, key_padding_mask=key_padding_mask)
        else:
            out = nystromformer_attention(
                q,
                k,
                v,
                self.num_landmarks,
                key_padding_mask=key_padding_mask,
                iterations=self.pinv_iterations,
                init=self.pinv_init,
            )
        if self.conv is not None:
            self._check_conv_lengths(lq, lk)
            out = out + nystromformer_conv_skip(v, self.conv)
        return out

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        lq, lk = q.shape[2], k.shape[2]
        k, v = zero_padded(key_padding_mask, k, v)
        if self.conv is not None:
            self._check_conv_lengths(lq, lk)
        if max(lq, lk) <= self.num_landmarks:  # every token is its own landmark: exact
            out = softmax_attention_reference(q, k, v, key_padding_mask=key_padding_mask)
        else:  # the three kernels as explicit matrices, the pseudo-inverse formed
            out = nystromformer_attention_reference(
                q,
                k,
                v,
                self.num_landmarks,
                key_padding_mask=key_padding_mask,
                iterations=self.pinv_iterations,
                init=self.pinv_init,
            )
        if self.conv is None:
            return out
        return out + nystromformer_conv_skip_reference(v, self.conv)

    def _check_conv_lengths(self, lq: int, lk: int) -> None:
        if lq != lk:
            raise ValueError(
                f"the convolution skip of Nyströmformer needs Lq == Lk, got {lq} and {lk}"
            )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"num_landmarks={self.num_landmarks}, pinv_iterations={self.pinv_iterations}, "
            f"pinv_init={self.pinv_init!r}, conv_kernel_size={self.conv_kernel_size}"
        )


register_mechanism(
    "nystromformer",
    NystromformerAttention,
    summary="Nyströmformer: softmax attention by the Nyström method with segment-mean "
    "landmarks and an iterative pseudo-inverse.",
    reference="Xiong et al., Nyströmformer: A Nyström-Based Algorithm for Approximating "
    "Self-Attention, AAAI 2021",
    complexity="O(L·m·(D+Dv) + m³) time, O(L·m + m²) memory (m landmarks)",
    approximates="softmax",
    size_option="num_landmarks",
    colour="#ff7f0e",
)
