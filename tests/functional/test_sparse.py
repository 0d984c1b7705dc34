"""Block-sparse softmax attention: the gathered core equals the dense reference on the same
pattern (forward and gradients), handles padding, empty rows and half inputs, and never forms
an ``(Lq, Lk)`` tensor."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kattn.functional import (
    block_pattern_to_dense,
    block_sparse_attention,
    sparse_attention_reference,
)
from tests.helpers import assert_close, grads, padding_mask, qkv


def random_table(b, h, n_q, n_k, kmax, *, seed=0, with_valid=False):
    """A random block table ``(B, H, nQ, K)`` with distinct blocks per row (and a random
    ``block_valid`` whose invalid slots hold -1)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(n_k, generator=g)[:kmax] for _ in range(b * h * n_q)]).view(
        b, h, n_q, kmax
    )
    if not with_valid:
        return idx, None
    valid = torch.rand(b, h, n_q, kmax, generator=g) < 0.6
    return torch.where(valid, idx, -1), valid


def check_same(q, k, v, idx, valid, token_mask, bs, key_padding_mask=None):
    lq, lk = q.shape[2], k.shape[2]
    out = block_sparse_attention(
        q,
        k,
        v,
        idx,
        block_size=bs,
        block_valid=valid,
        token_mask=token_mask,
        key_padding_mask=key_padding_mask,
    )
    allowed = block_pattern_to_dense(idx, valid, token_mask, lq, lk, bs)
    ref = sparse_attention_reference(q, k, v, allowed, key_padding_mask=key_padding_mask)
    assert_close(out, ref)
    for g_out, g_ref in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert torch.isfinite(g_out).all()
        assert_close(g_out, g_ref)
    return out, allowed


def test_dense_pattern_matches_an_explicit_loop():
    bs, lq, lk = 4, 10, 13
    idx, valid = random_table(1, 2, 3, 4, 2, seed=3, with_valid=True)
    dense = block_pattern_to_dense(idx, valid, lambda i, j: j <= i + 1, lq, lk, bs)
    expected = torch.zeros(1, 2, lq, lk, dtype=torch.bool)
    for hh in range(2):
        for i in range(lq):
            for slot in range(2):
                if valid[0, hh, i // bs, slot]:
                    blk = int(idx[0, hh, i // bs, slot])
                    for j in range(blk * bs, min(lk, (blk + 1) * bs)):
                        expected[0, hh, i, j] = j <= i + 1
    assert torch.equal(dense, expected)


@pytest.mark.parametrize("with_valid", [False, True])
@pytest.mark.parametrize("lq, lk, bs", [(37, 37, 8), (32, 32, 8), (21, 45, 8), (40, 17, 5)])
def test_core_matches_reference_on_random_tables(with_valid, lq, lk, bs):
    q, k, v = qkv(lq=lq, lk=lk, seed=1, requires_grad=True)
    n_q, n_k = -(-lq // bs), -(-lk // bs)
    idx, valid = random_table(2, 3, n_q, n_k, min(3, n_k), seed=2, with_valid=with_valid)
    check_same(q, k, v, idx, valid, None, bs)


def test_causal_token_mask_as_callable_and_as_tensor():
    lq, bs = 37, 8
    q, k, v = qkv(lq=lq, seed=4, requires_grad=True)
    n = -(-lq // bs)
    # local causal pattern: each query block reads itself and the one before (if any)
    blocks = torch.arange(n)
    idx = torch.stack([blocks, (blocks - 1).clamp_min(0)], dim=-1)  # (nQ, 2): a repeat at 0
    out, allowed = check_same(q, k, v, idx, None, lambda i, j: j <= i, bs)
    i, j = torch.arange(lq)[:, None], torch.arange(lq)[None, :]
    assert torch.equal(allowed[0, 0], (j <= i) & (j >= (i // bs - 1).clamp_min(0) * bs))
    key_pos = (idx[..., None] * bs + torch.arange(bs)).flatten(-2)  # (nQ, K·block)
    query_pos = torch.arange(n)[:, None] * bs + torch.arange(bs)
    tensor_mask = key_pos[:, None, :] <= query_pos[..., None]  # (nQ, block, K·block)
    out_t, _ = check_same(q, k, v, idx, None, tensor_mask, bs)
    assert_close(out_t, out)


def test_repeated_blocks_count_once():
    q, k, v = qkv(lq=24, seed=5)
    idx = torch.tensor([[0, 1], [1, 1], [2, 0]])
    twice = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [2, 0, 2, 2]])
    once = block_sparse_attention(q, k, v, idx, block_size=8)
    assert_close(block_sparse_attention(q, k, v, twice, block_size=8), once)


def test_key_padding_and_unaligned_lengths():
    lq, lk, bs = 37, 29, 8
    q, k, v = qkv(lq=lq, lk=lk, seed=6, requires_grad=True)
    pad = padding_mask(2, lk, (0, 11))
    with torch.no_grad():  # a NaN stored under padding must not get through
        k[1, :, -1] = float("nan")
        v[1, :, -2] = float("nan")
    idx, valid = random_table(2, 3, 5, 4, 3, seed=7, with_valid=True)
    check_same(q, k, v, idx, valid, lambda i, j: (i - j).abs() <= 9, bs, key_padding_mask=pad)


def test_a_row_that_sees_nothing_gives_zero_with_finite_gradients():
    q, k, v = qkv(lq=16, seed=8, requires_grad=True)
    idx = torch.tensor([[0], [1]])
    valid = torch.tensor([[True], [False]])  # the second query block reads nothing
    out, _ = check_same(q, k, v, idx, valid, None, 8)
    assert torch.equal(out[:, :, 8:], torch.zeros_like(out[:, :, 8:]))
    out = block_sparse_attention(q, k, v, idx, block_size=8, token_mask=lambda i, j: j > i)
    assert torch.equal(out[:, :, 7], torch.zeros_like(out[:, :, 7]))  # last of block 0
    for g in grads(out, q, k, v):
        assert torch.isfinite(g).all()


def test_bf16_stays_finite_and_close_to_fp32():
    q, k, v = qkv(lq=64, seed=9, dtype=torch.float32)
    idx, valid = random_table(2, 3, 8, 8, 3, seed=10, with_valid=True)
    causal = lambda i, j: j <= i  # noqa: E731
    ref = block_sparse_attention(q, k, v, idx, block_size=8, block_valid=valid, token_mask=causal)
    half = [x.to(torch.bfloat16) for x in (q, k, v)]
    out = block_sparse_attention(*half, idx, block_size=8, block_valid=valid, token_mask=causal)
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert_close(out, ref)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def local_table(n, kmax=3):
    """Each query block reads itself and its neighbours (clamped at the ends)."""
    blocks = torch.arange(n)[:, None] + torch.arange(kmax) - kmax // 2
    return blocks.clamp(0, n - 1)


def test_no_tensor_of_lq_times_lk_elements_is_formed():
    length, bs = 4096, 64
    q, k, v = qkv(b=1, h=1, lq=length, d=4, dv=4, dtype=torch.float32, requires_grad=True)
    idx = local_table(length // bs)
    with _LargestTensor() as mode:
        out = block_sparse_attention(q, k, v, idx, block_size=bs, token_mask=lambda i, j: j <= i)
        out.sum().backward()
    assert mode.largest < length * length // 16  # the scores are L·K·block = L²/21


def test_l_65536_runs_in_seconds_on_cpu():
    length, bs = 65536, 64  # a dense fp32 (L, L) matrix alone would take 16 GiB
    q, k, v = qkv(b=1, h=1, lq=length, d=8, dv=8, dtype=torch.float32)
    start = time.perf_counter()
    out = block_sparse_attention(q, k, v, local_table(length // bs), block_size=bs)
    elapsed = time.perf_counter() - start
    assert out.shape == (1, 1, length, 8) and torch.isfinite(out).all()
    assert elapsed < 10.0, f"took {elapsed:.1f} s"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 0}, "block_size"),
        ({"block_index": torch.tensor([[0], [4]])}, "block_index"),
        ({"block_index": torch.tensor([[-1], [0]])}, "block_index"),
        ({"block_index": torch.zeros(1, 1, 1, 2, 1, dtype=torch.long)}, "block_index"),
        ({"block_index": torch.zeros(3, 1, dtype=torch.long)}, "block_index"),
        ({"block_index": torch.zeros(2, 1)}, "block_index"),
        ({"block_valid": torch.ones(2, 1)}, "block_valid"),
        ({"token_mask": torch.ones(2, 8, 9, dtype=torch.bool)}, "token_mask"),
        ({"key_padding_mask": torch.zeros(2, 16)}, "key_padding_mask"),
    ],
)
def test_bad_arguments_raise_a_value_error_naming_them(kwargs, match):
    q, k, v = qkv(lq=16, lk=32)
    args = {"block_index": torch.tensor([[0], [3]]), "block_size": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        block_sparse_attention(q, k, v, **args)


def test_reference_rejects_a_bad_pattern():
    q, k, v = qkv(lq=16)
    with pytest.raises(ValueError, match="allowed"):
        sparse_attention_reference(q, k, v, torch.ones(16, 15, dtype=torch.bool))


def test_chunks_of_query_blocks_give_the_same_result(monkeypatch):
    import kattn.functional.sparse as sparse

    q, k, v = qkv(lq=37, seed=11, requires_grad=True)
    idx, valid = random_table(2, 3, 5, 5, 3, seed=12, with_valid=True)
    monkeypatch.setattr(sparse, "_CHUNK_ELEMENTS", 1)  # one query block per chunk
    check_same(q, k, v, idx, valid, lambda i, j: j <= i, 8)
