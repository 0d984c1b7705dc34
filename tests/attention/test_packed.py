"""Attention over packed documents (``Attention.forward_packed``): for every mechanism, each
document's output is that of a call on the document alone, and nothing crosses documents."""

from __future__ import annotations

import pytest
import torch

import kattn

from ..helpers import assert_close

MECHANISMS = kattn.available()
H, D, DV, MAX_LEN = 2, 12, 6, 48
LENGTHS = (7, 20, 1, 0, 13)  # an empty document too


def _cu(lengths: tuple[int, ...]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _make(name: str) -> kattn.Attention:
    torch.manual_seed(0)
    return kattn.build(name, head_dim=D, num_heads=H, max_len=MAX_LEN).double().eval()


def _packed(total: int, total_k: int | None = None, *, seed: int = 0, grad: bool = False):
    total_k = total if total_k is None else total_k
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, total, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, H, total_k, D, generator=g, dtype=torch.float64)
    v = torch.randn(1, H, total_k, DV, generator=g, dtype=torch.float64)
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def _one_by_one(attn, q, k, v, cu, cu_k=None, *, causal: bool) -> torch.Tensor:
    cu_k = cu if cu_k is None else cu_k
    outs = [
        attn(q[:, :, a:b], k[:, :, c:d], v[:, :, c:d], causal=causal)
        for a, b, c, d in zip(cu[:-1], cu[1:], cu_k[:-1], cu_k[1:], strict=True)
        if b > a
    ]
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize(
    ("name", "causal"),
    [(n, c) for n in MECHANISMS for c in (False, True) if not c or kattn.spec(n).supports_causal],
)
def test_each_document_gets_the_output_of_a_call_on_it_alone(name, causal) -> None:
    attn = _make(name)
    cu = _cu(LENGTHS)
    q, k, v = _packed(cu[-1])
    out = attn.forward_packed(q, k, v, cu, causal=causal)
    assert out.shape == (1, H, cu[-1], DV)
    assert_close(out, _one_by_one(attn, q, k, v, cu, causal=causal))
    # a document ×30 heavier (and shifted values) leaves the others' outputs as they were
    heavy = [x.clone() for x in (q, k, v)]
    second = slice(cu[1], cu[2])
    for x in heavy[:2]:
        x[:, :, second] *= 30
    heavy[2][:, :, second] += 5
    moved = attn.forward_packed(*heavy, cu, causal=causal)
    others = torch.ones(cu[-1], dtype=torch.bool)
    others[second] = False
    assert torch.equal(moved[:, :, others], out[:, :, others])


#: mechanisms whose output for a document depends on its padding: Skyformer's eval landmark
#: draw is keyed by the padded lengths, SMYRF's balanced clusters of cross-attention take the
#: padded query rows too (cross-attention has no query padding). Nothing crosses documents.
PADDING_SHAPED = {"skyformer": ("self", "cross"), "smyrf": ("cross",)}


def _check_documents(name, attn, q, k, v, cu, cu_k, *, kind: str) -> None:
    """Outputs equal to the documents' own calls, or, for the mechanisms above, outputs of
    the other documents unmoved by a ×30 heavier second document."""
    out = attn.forward_packed(q, k, v, torch.tensor(cu), cu_seqlens_k=torch.tensor(cu_k))
    if kind not in PADDING_SHAPED.get(name, ()):
        assert_close(out, _one_by_one(attn, q, k, v, cu, cu_k, causal=False))
        return
    assert torch.isfinite(out).all()
    heavy = [x.clone() for x in (q, k, v)]
    heavy[0][:, :, cu[1] : cu[2]] *= 30
    for x in heavy[1:]:
        x[:, :, cu_k[1] : cu_k[2]] *= 30
    moved = attn.forward_packed(*heavy, cu, cu_seqlens_k=cu_k)
    assert torch.equal(moved[:, :, : cu[1]], out[:, :, : cu[1]])
    assert torch.equal(moved[:, :, cu[2] :], out[:, :, cu[2] :])


@pytest.mark.parametrize("name", [n for n in MECHANISMS if kattn.spec(n).supports_cross])
def test_cross_attention_pairs_query_and_key_documents(name) -> None:
    cu, cu_k = _cu((5, 0, 11, 3)), _cu((9, 4, 2, 17))  # a key document without queries too
    _check_documents(name, _make(name), *_packed(cu[-1], cu_k[-1]), cu, cu_k, kind="cross")


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize(
    "name", ["clustered", "improved_clustered", "informer", "nystromformer", "skyformer", "smyrf"]
)
def test_documents_longer_than_the_landmarks_and_clusters(name, kind) -> None:
    """Documents long enough that landmarks, clusters and sampled queries approximate."""
    torch.manual_seed(0)
    attn = kattn.build(name, head_dim=D, num_heads=H, max_len=128).double().eval()
    cu = _cu((40, 100, 70))
    cu_k = cu if kind == "self" else _cu((90, 30, 120))
    _check_documents(name, attn, *_packed(cu[-1], cu_k[-1]), cu, cu_k, kind=kind)


@pytest.mark.parametrize("name", ["softmax", "performer", "nprf_rpe", "nystromformer"])
def test_gradients_are_those_of_the_documents_alone(name) -> None:
    attn = _make(name)
    causal = attn.supports_causal
    cu = _cu((6, 15, 9))
    q, k, v = _packed(cu[-1], grad=True)
    weights = torch.randn(1, H, cu[-1], DV, generator=torch.Generator().manual_seed(5))
    (attn.forward_packed(q, k, v, cu, causal=causal) * weights).sum().backward()
    packed = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    (_one_by_one(attn, q, k, v, cu, causal=causal) * weights).sum().backward()
    for got, expected in zip(packed, (q.grad, k.grad, v.grad), strict=True):
        assert_close(got, expected)


def test_equal_documents_need_no_padding_and_no_query_means_no_output() -> None:
    attn = _make("performer")
    q, k, v = _packed(12)
    out = attn.forward_packed(q, k, v, [0, 4, 8, 12], causal=True)
    assert_close(out, _one_by_one(attn, q, k, v, [0, 4, 8, 12], causal=True))
    empty = attn.forward_packed(q[:, :, :0], k, v, [0, 0], cu_seqlens_k=[0, 12])
    assert empty.shape == (1, H, 0, DV)


def test_packed_inputs_that_cannot_be_are_refused() -> None:
    attn = _make("softmax")
    q, k, v = _packed(10)
    with pytest.raises(ValueError, match=r"q must be packed as \(1, H, T, D\)"):
        attn.forward_packed(q.expand(2, -1, -1, -1), k, v, [0, 10])
    with pytest.raises(ValueError, match="cu_seqlens must end at the packed length T=10"):
        attn.forward_packed(q, k, v, [0, 4, 9])
    with pytest.raises(ValueError, match="pass cu_seqlens_k"):
        attn.forward_packed(q, k[:, :, :8], v[:, :, :8], [0, 10])
    with pytest.raises(ValueError, match="2 documents and cu_seqlens_k 1"):
        attn.forward_packed(q, k, v, [0, 4, 10], cu_seqlens_k=[0, 10])
    with pytest.raises(ValueError, match="query and key lengths equal"):
        attn.forward_packed(q, k, v, [0, 4, 10], cu_seqlens_k=[0, 5, 10], causal=True)
    with pytest.raises(ValueError, match=r"documents \[1\] have queries but no keys"):
        attn.forward_packed(q, k, v, [0, 4, 10], cu_seqlens_k=[0, 10, 10])
    with pytest.raises(NotImplementedError, match="cross-attention"):
        _make("local").forward_packed(q, k, v, [0, 4, 10], cu_seqlens_k=[0, 6, 10])
