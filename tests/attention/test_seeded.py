"""The seeded-randomness contract (:mod:`kattn.attention.seeded`) for every mechanism that
draws its pattern at random: eval fixed and independent of the batch and of torch's global
RNG, a new draw per training forward from the seed alone, the draw reused when activation
checkpointing re-runs the forward, seed and draws kept by ``state_dict()``, the seed and a
foreign extra state refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import kattn
from kattn.attention.seeded import SeededDraws
from kattn.registry import MECHANISMS

from ..helpers import assert_close, grads, padding_mask, qkv

H, D = 2, 16
PADS = (0, 6, 13)


@dataclass(frozen=True)
class Case:
    """Options under which the draw matters at ``length`` tokens, and the module's eval draw
    as tensors, ``eval_draw(module, q, mask)``; ``per_example``: the draw has a batch axis
    (the clustering of each sequence's queries) rather than being shared by the batch."""

    options: dict[str, Any]
    length: int
    eval_draw: Callable[[Any, torch.Tensor, torch.Tensor | None], list[torch.Tensor]]
    per_example: bool = False


def _clusters(m: Any, q: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
    return [m.clusters(q, mask)]


_CLUSTERED = {"num_clusters": 4, "bits": 24}
CASES = {
    "bigbird": Case(
        {"block_size": 4, "num_random_blocks": 2, "num_global": 4},
        61,
        lambda m, q, mask: [m.pattern(61), m.pattern(61, causal=True)],
    ),
    "reformer": Case({"bucket_size": 4}, 40, lambda m, q, mask: [m.rotations(40)]),
    "smyrf": Case({"cluster_size": 8}, 45, lambda m, q, mask: [m.projections()]),
    "informer": Case({"factor": 2}, 45, lambda m, q, mask: [m.uniforms(45, 45)]),
    "clustered": Case(_CLUSTERED, 33, _clusters, per_example=True),
    "improved_clustered": Case(_CLUSTERED | {"topk": 5}, 33, _clusters, per_example=True),
}
NAMES = list(CASES)


def _build(name: str, seed: int = 0) -> Any:
    attn = kattn.build(name, head_dim=D, num_heads=H, seed=seed, **CASES[name].options)
    return attn.double().eval()


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_every_seeded_mechanism_is_covered():
    seeded = {n for n in kattn.available() if issubclass(MECHANISMS.get(n).cls, SeededDraws)}
    assert seeded == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_eval_is_fixed_and_ignores_the_batch_and_the_global_rng(name):
    case, attn = CASES[name], _build(name)
    q, k, v = qkv(3, H, case.length)
    mask = padding_mask(3, case.length, PADS)
    torch.manual_seed(1)
    out = attn(q, k, v, key_padding_mask=mask)
    draw = case.eval_draw(attn, q, mask)
    torch.manual_seed(2)
    assert torch.equal(attn(q, k, v, key_padding_mask=mask), out)
    assert _same(case.eval_draw(attn, q, mask), draw)
    for b in range(3):
        rows = slice(b, b + 1)
        assert_close(attn(q[rows], k[rows], v[rows], key_padding_mask=mask[rows]), out[rows])
        alone = case.eval_draw(attn, q[rows], mask[rows])
        assert _same(alone, [x[rows] for x in draw] if case.per_example else draw)
    other = _build(name, seed=5)
    assert not _same(case.eval_draw(other, q, mask), draw)
    assert not torch.allclose(other(q, k, v, key_padding_mask=mask), out)


@pytest.mark.parametrize("name", NAMES)
def test_training_redraws_each_forward_from_the_seed_alone(name):
    """Consecutive training forwards differ; two modules with one seed draw the same sequence
    whatever torch's global RNG and batch; another seed draws another sequence."""
    case = CASES[name]
    q, k, v = qkv(3, H, case.length)
    a, b, c = (_build(name, seed).train() for seed in (3, 3, 4))
    outs_a, outs_b = [], []
    for step in range(3):
        torch.manual_seed(step)
        outs_a.append(a(q, k, v))
        torch.manual_seed(100 + step)
        outs_b.append(b(q[1:2], k[1:2], v[1:2]))
    for out_a, out_b in zip(outs_a, outs_b, strict=True):
        assert_close(out_a[1:2], out_b)
    assert not torch.allclose(outs_a[0], outs_a[1]) and not torch.allclose(outs_a[1], outs_a[2])
    assert not torch.allclose(c(q, k, v), outs_a[0])
    assert a.get_extra_state().tolist() == [3, 3]  # seed, draws
    assert not _same(case.eval_draw(a.eval(), q, None), case.eval_draw(c.eval(), q, None))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_keeps_the_eval_draw_and_the_draw_sequence(name):
    case = CASES[name]
    q, k, v = qkv(1, H, case.length)
    a = _build(name, 7).train()
    a(q, k, v)
    a(q, k, v)
    b = _build(name, 0).train()
    assert not _same(case.eval_draw(b, q, None), case.eval_draw(a, q, None))
    b.load_state_dict(a.state_dict())
    assert b.get_extra_state().tolist() == [7, 2]
    assert torch.equal(b(q, k, v), a(q, k, v))  # draw 3 of seed 7 for both
    a.eval(), b.eval()
    assert _same(case.eval_draw(b, q, None), case.eval_draw(a, q, None))
    assert torch.equal(b(q, k, v), a(q, k, v))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_recomputation_reuses_the_draw(name):
    """Activation checkpointing re-runs the forward inside backward: it must take the same
    draw, so the gradients equal those of the plain forward of that draw."""
    a, b = _build(name, 5).train(), _build(name, 5).train()
    q, k, v = qkv(1, H, CASES[name].length, requires_grad=True)
    out_a = checkpoint(a, q, k, v, use_reentrant=False)
    out_b = b(q, k, v)
    assert_close(out_a, out_b)
    for g_a, g_b in zip(grads(out_a, q, k, v), grads(out_b, q, k, v), strict=True):
        assert_close(g_a, g_b)
    assert a.get_extra_state().tolist() == [5, 1]
    assert torch.equal(a(q, k, v), b(q, k, v))  # both take draw 2 next


@pytest.mark.parametrize("name", NAMES)
def test_the_seed_and_a_foreign_extra_state_are_refused(name):
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        kattn.build(name, head_dim=D, num_heads=H, seed=-1)
    attn = _build(name)
    for state in ({"seed": "x", "draws": 0}, {"seed": 0}, {"seed": 0, "draws": -1}, [0, 0]):
        with pytest.raises(ValueError, match="seed"):
            attn.set_extra_state(state)
