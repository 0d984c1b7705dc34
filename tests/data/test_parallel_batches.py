"""Joint BPE (round trip, special ids, saved and reloaded) and token-based batching: the
budget counted with padding, every pair exactly once, determinism per (seed, epoch), pairs
that do not fit, and the padded tensors."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch

from kattn.data.parallel_batches import (
    BOS_ID,
    EOS_ID,
    SPECIAL_TOKENS,
    JointBPE,
    collate_pairs,
    iterate_batches,
    token_batches,
)

EN = ("the", "cat", "sees", "a", "small", "dog", "near", "old", "houses", "with", "windows")
DE = ("die", "Katze", "sieht", "einen", "kleinen", "Hund", "nahe", "alten", "Häusern", "Fenster")


def pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 9)
        en = " ".join(rng.choice(EN) for _ in range(k)) + "."
        de = " ".join(rng.choice(DE) for _ in range(k + rng.randint(0, 2))) + "!"
        out.append((en, de))
    return out


@pytest.fixture(scope="module")
def bpe() -> JointBPE:
    pytest.importorskip("tokenizers")
    texts = [side for pair in pairs(300) for side in pair]
    return JointBPE.train(texts, vocab_size=400)


def test_bpe_round_trip_and_special_ids(bpe: JointBPE, tmp_path: Path) -> None:
    assert 4 + 256 < bpe.vocab_size <= 400
    for en, de in [*pairs(20, seed=1), ("Größe: 3½ — ünseen wörds ✓", "naïve café")]:
        for text in (en, de):
            ids = bpe.encode(text)
            assert min(ids) >= len(SPECIAL_TOKENS) and max(ids) < bpe.vocab_size
            assert bpe.decode(ids) == text
            assert bpe.decode([BOS_ID, *ids, EOS_ID, 0, 0]) == text  # specials left out
    assert len(bpe.encode("the small dog")) < len("the small dog")  # merges were learned
    reloaded = JointBPE.from_file(bpe.save(tmp_path / "bpe.json"))
    assert reloaded.encode_batch(["die Katze", "the cat"]) == bpe.encode_batch(
        ["die Katze", "the cat"]
    )
    assert JointBPE.train([s for p in pairs(300) for s in p], 400).encode("the houses") == (
        bpe.encode("the houses")
    )  # training is deterministic


def test_bpe_rejects_a_vocabulary_without_the_special_ids(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    other = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    other.add_special_tokens(["<unk>", "<pad>", "<bos>", "<eos>"])
    other.save(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="<pad> has id 1, expected 0"):
        JointBPE.from_file(tmp_path / "other.json")
    with pytest.raises(ValueError, match="256 bytes"):
        JointBPE.train(["a"], vocab_size=100)


def lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)], [rng.randint(1, 40) for _ in range(n)]


@pytest.mark.parametrize("max_tokens", [41, 100, 333])
def test_budget_respected_every_pair_once(max_tokens: int) -> None:
    src, tgt = lengths(500)
    plan = token_batches(src, tgt, max_tokens, seed=3)
    flat = [i for batch in plan.batches for i in batch]
    assert sorted(flat) == list(range(500)) and plan.skipped == []
    for batch in plan.batches:
        width = max(max(src[i], tgt[i]) + 1 for i in batch)
        assert width * len(batch) <= max_tokens
    # batches are runs of the width order, each cut only when the next pair would not fit
    spans = sorted(  # a partial batch comes after the full ones of its width
        (min(widths), max(widths), -len(widths))
        for widths in ([max(src[i], tgt[i]) + 1 for i in batch] for batch in plan.batches)
    )
    for (_, high, size), (next_low, _, _) in itertools.pairwise(spans):
        assert high <= next_low
        assert next_low * (1 - size) > max_tokens


def test_batches_deterministic_per_seed_and_epoch() -> None:
    src, tgt = lengths(300, seed=1)
    a = token_batches(src, tgt, 120, seed=0, epoch=0).batches
    assert a == token_batches(src, tgt, 120, seed=0, epoch=0).batches
    assert a != token_batches(src, tgt, 120, seed=0, epoch=1).batches
    assert a != token_batches(src, tgt, 120, seed=1, epoch=0).batches


def test_pairs_longer_than_the_budget() -> None:
    src, tgt = [3, 50, 4, 9], [2, 1, 70, 9]
    with pytest.raises(ValueError, match=r"pair 1 takes 51 columns .* \(2 such pairs\)"):
        token_batches(src, tgt, 20)
    plan = token_batches(src, tgt, 20, too_long="skip")
    assert plan.skipped == [1, 2]
    assert sorted(i for b in plan.batches for i in b) == [0, 3]


def test_collate_pads_and_shifts() -> None:
    src_ids, tgt_ids = [[5, 6, 7], [8]], [[9], [10, 11, 12, 13]]
    batch = collate_pairs(src_ids, tgt_ids, [1, 0])
    assert batch.indices.tolist() == [1, 0]
    assert batch.src.tolist() == [[8, EOS_ID, 0, 0], [5, 6, 7, EOS_ID]]
    assert batch.src_padding.tolist() == [[False, False, True, True], [False] * 4]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, 11, 12, 13], [BOS_ID, 9, 0, 0, 0]]
    assert batch.tgt_out.tolist() == [[10, 11, 12, 13, EOS_ID], [9, EOS_ID, 0, 0, 0]]
    assert batch.tgt_padding.tolist() == [[False] * 5, [False, False, True, True, True]]
    assert torch.equal(batch.tgt_in == 0, batch.tgt_padding)
    assert batch.num_tokens() == 2 * 5


def test_iterate_batches_on_encoded_pairs(bpe: JointBPE) -> None:
    data = pairs(200, seed=2)
    src_ids = bpe.encode_batch([s for s, _ in data])
    tgt_ids = bpe.encode_batch([t for _, t in data])
    seen = []
    for batch in iterate_batches(src_ids, tgt_ids, 256, seed=0):
        assert batch.num_tokens() <= 256
        for row, i in enumerate(batch.indices.tolist()):
            length = len(tgt_ids[i])
            assert bpe.decode(batch.tgt_out[row, :length]) == data[i][1]
            assert batch.tgt_out[row, length] == EOS_ID
        seen += batch.indices.tolist()
    assert sorted(seen) == list(range(200))
