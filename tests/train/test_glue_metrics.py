"""GLUE's metrics against hand-computed values and plain-Python references (no scipy)."""

from __future__ import annotations

import math

import pytest
import torch

from kattn.train.glue_metrics import (
    accuracy,
    average_ranks,
    baseline_predictions,
    f1_score,
    matthews_corrcoef,
    pearson,
    spearman,
    task_metrics,
)

PRED = [1, 1, 0, 0, 1, 0]
LABELS = [1, 0, 0, 0, 1, 1]  # TP 2, FP 1, TN 2, FN 1


def test_binary_metrics_by_hand() -> None:
    assert accuracy(PRED, LABELS) == pytest.approx(4 / 6)
    assert matthews_corrcoef(PRED, LABELS) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3**4))
    assert f1_score(PRED, LABELS) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert f1_score(PRED, LABELS, positive=0) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))


def _mcc_reference(pred: list[int], labels: list[int], k: int) -> float:
    """Gorodkin's R_K as the covariance of the one-hot codes over their variances."""
    n = len(pred)
    x = [[float(p == c) for c in range(k)] for p in pred]
    y = [[float(t == c) for c in range(k)] for t in labels]
    mx = [sum(row[c] for row in x) / n for c in range(k)]
    my = [sum(row[c] for row in y) / n for c in range(k)]

    def cov(a: list[list[float]], ma: list[float], b: list[list[float]], mb: list[float]) -> float:
        return sum((a[i][c] - ma[c]) * (b[i][c] - mb[c]) for i in range(n) for c in range(k))

    return cov(x, mx, y, my) / math.sqrt(cov(x, mx, x, mx) * cov(y, my, y, my))


def test_matthews_multiclass_matches_one_hot_correlation() -> None:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (200,), generator=g)
    pred = torch.where(
        torch.rand(200, generator=g) < 0.6, labels, torch.randint(0, 3, (200,), generator=g)
    )
    expected = _mcc_reference(pred.tolist(), labels.tolist(), 3)
    assert matthews_corrcoef(pred, labels) == pytest.approx(expected, abs=1e-12)
    assert 0.2 < expected < 0.9  # a real correlation, not a degenerate case


def test_degenerate_cases() -> None:
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0  # one class predicted
    assert matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert f1_score([0, 0], [0, 0]) == 0.0
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="one length"):
        accuracy([1, 0], [1])


def _pearson_reference(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def test_pearson_and_spearman() -> None:
    x, y = [1.0, 2.0, 3.0, 4.0, 5.5], [2.0, 4.0, 5.0, 9.0, 8.0]
    assert pearson(x, y) == pytest.approx(_pearson_reference(x, y), abs=1e-12)
    # ties averaged: ranks of x are 1, 2.5, 2.5, 4; by hand r = 4.5 / √(4.5 · 5)
    assert spearman([1.0, 2.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(
        4.5 / math.sqrt(4.5 * 5.0)
    )
    assert spearman([1.0, 5.0, 2.0], [10.0, 900.0, 11.0]) == pytest.approx(1.0)  # monotone
    assert average_ranks([3.0, 1.0, 3.0, 3.0]).tolist() == [3.0, 1.0, 3.0, 3.0]
    assert average_ranks([0.5, 0.2, 0.9]).tolist() == [2.0, 1.0, 3.0]


def test_task_metrics_and_baseline() -> None:
    values = task_metrics(("matthews", "accuracy"), PRED, LABELS)
    assert set(values) == {"matthews", "accuracy"}
    with pytest.raises(ValueError, match="metrics must be among"):
        task_metrics(("bleu",), PRED, LABELS)
    train = torch.tensor([2, 0, 2, 1, 2])
    assert baseline_predictions(train, 3, regression=False).tolist() == [2, 2, 2]
    mean = baseline_predictions(torch.tensor([1.0, 2.0, 4.5]), 2, regression=True)
    assert mean.tolist() == pytest.approx([2.5, 2.5])
