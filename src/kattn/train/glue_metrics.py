"""The official GLUE metrics (Wang et al. 2019), computed in float64 from predictions.

Matthews correlation (CoLA), F1 of the positive class and accuracy (MRPC, QQP), Pearson and
Spearman correlation (STS-B; Spearman ranks tied values by their average rank) and accuracy
(the rest). A correlation of a constant series is undefined: NaN (``results.json`` writes it
as null). :func:`task_metrics` gives every metric a task names, :func:`baseline_predictions`
the predictions of the majority (or mean) baseline they are compared with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

#: the metrics :func:`task_metrics` knows.
METRIC_NAMES = ("accuracy", "matthews", "f1", "pearson", "spearman")
#: predictions, labels or scores: a sequence of numbers or a tensor of them.
Series = Sequence[float] | Tensor


def _as_f64(values: Series) -> Tensor:
    return torch.as_tensor(values).detach().to(torch.float64).flatten().cpu()


def _check(pred: Tensor, labels: Tensor) -> None:
    if pred.shape != labels.shape or not len(pred):
        raise ValueError(
            f"predictions and labels must be two non-empty series of one length, got "
            f"{tuple(pred.shape)} and {tuple(labels.shape)}"
        )


def accuracy(pred: Series, labels: Series) -> float:
    """The share of predictions equal to their label."""
    p, y = _as_f64(pred), _as_f64(labels)
    _check(p, y)
    return float((p == y).double().mean())


def matthews_corrcoef(pred: Series, labels: Series) -> float:
    """Matthews's correlation of class predictions with labels, for any number of classes
    (Gorodkin 2004): ``(c·s − Σ_k p_k t_k) / √((s² − Σ p_k²)(s² − Σ t_k²))`` with ``c``
    correct, ``s`` examples, ``p_k``/``t_k`` predicted/true counts of class ``k``; for two
    classes ``(TP·TN − FP·FN) / √((TP+FP)(TP+FN)(TN+FP)(TN+FN))``. 0 when a factor of the
    denominator is 0 (one class predicted, or one class present)."""
    p, y = _as_f64(pred).long(), _as_f64(labels).long()
    _check(p, y)
    k = int(max(p.max(), y.max())) + 1
    p_counts = torch.bincount(p, minlength=k).double()
    t_counts = torch.bincount(y, minlength=k).double()
    s, c = float(len(p)), float((p == y).sum())
    numerator = c * s - float((p_counts * t_counts).sum())
    denominator = (s * s - float((p_counts**2).sum())) * (s * s - float((t_counts**2).sum()))
    return numerator / math.sqrt(denominator) if denominator > 0 else 0.0


def f1_score(pred: Series, labels: Series, positive: int = 1) -> float:
    """F1 of class ``positive``: ``2·TP / (2·TP + FP + FN)`` (0 when there is no positive
    prediction nor label)."""
    p, y = _as_f64(pred), _as_f64(labels)
    _check(p, y)
    tp = float(((p == positive) & (y == positive)).sum())
    fp = float(((p == positive) & (y != positive)).sum())
    fn = float(((p != positive) & (y == positive)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0


def pearson(x: Series, y: Series) -> float:
    """Pearson's correlation ``Σ(x−x̄)(y−ȳ) / √(Σ(x−x̄)² Σ(y−ȳ)²)`` (NaN when either series
    is constant)."""
    a, b = _as_f64(x), _as_f64(y)
    _check(a, b)
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum()) / denominator if denominator > 0 else math.nan


def average_ranks(values: Series) -> Tensor:
    """The 1-based ranks of ``values``, tied values sharing the average of their ranks."""
    v = _as_f64(values)
    order = torch.argsort(v, stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(1, len(v) + 1, dtype=torch.float64)
    _, groups = torch.unique(v, return_inverse=True)
    sums = torch.zeros(int(groups.max()) + 1 if len(v) else 0, dtype=torch.float64)
    sums.index_add_(0, groups, ranks)
    counts = torch.bincount(groups).double()
    return (sums / counts)[groups]


def spearman(x: Series, y: Series) -> float:
    """Spearman's correlation: Pearson's of the average ranks (ties averaged)."""
    a, b = _as_f64(x), _as_f64(y)
    _check(a, b)
    return pearson(average_ranks(a), average_ranks(b))


_FUNCTIONS = {
    "accuracy": accuracy,
    "matthews": matthews_corrcoef,
    "f1": f1_score,
    "pearson": pearson,
    "spearman": spearman,
}


def task_metrics(names: Sequence[str], pred: Series, labels: Series) -> dict[str, float]:
    """Each metric of ``names`` (of :data:`METRIC_NAMES`) of ``pred`` against ``labels``."""
    unknown = [n for n in names if n not in _FUNCTIONS]
    if unknown:
        raise ValueError(f"metrics must be among {', '.join(METRIC_NAMES)}, got {unknown}")
    return {name: _FUNCTIONS[name](pred, labels) for name in names}


def baseline_predictions(train_labels: Tensor, n: int, regression: bool) -> Tensor:
    """``n`` predictions of the baseline: the most frequent training class (the smallest id
    on a tie), or the mean training target for regression."""
    if regression:
        return torch.full((n,), float(train_labels.double().mean()), dtype=torch.float64)
    majority = int(torch.bincount(train_labels.long()).argmax())
    return torch.full((n,), majority, dtype=torch.int64)
