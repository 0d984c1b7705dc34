"""Bag-of-bytes baselines of a text-classification set in AG News's layout (default: the
embedded gettext set): multinomial naive Bayes over the UTF-8 byte counts of each text, and
over its byte-bigram counts, with add-one smoothing, fitted on the training examples the
neural runs train on (train.csv less the same seeded tenth held out) and scored on test.csv;
beside them the majority baseline. No setting to tune, nothing random.

    python benchmarks/text_classes_baseline.py --out benchmarks/results/finetuning/bag-of-bytes.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from kattn.data.agnews import load_agnews
from kattn.data.text_classification_embedded import MANIFEST, embedded_text_classes
from kattn.train.finetune_data import split_train


def byte_grams(text: str, order: int) -> torch.Tensor:
    """The ids ``0 … 256**order − 1`` of the byte n-grams of length ``order`` of ``text``."""
    raw = torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
    n = len(raw) - order + 1
    if n < 1:
        return torch.zeros(0, dtype=torch.int64)
    grams = raw[:n].clone()
    for k in range(1, order):
        grams = grams * 256 + raw[k : k + n]
    return grams


def naive_bayes_accuracy(
    train: list[str], labels: list, test: list[str], test_labels: list, order: int
) -> float:
    """Test accuracy of multinomial naive Bayes over byte n-grams, add-one smoothing."""
    classes = max(labels) + 1
    counts = torch.zeros(classes, 256**order, dtype=torch.float64)
    for text, label in zip(train, labels, strict=True):
        grams = byte_grams(text, order)
        counts[label].index_add_(0, grams, torch.ones(len(grams), dtype=torch.float64))
    log_p = torch.log(counts + 1) - torch.log((counts + 1).sum(1, keepdim=True))
    prior = torch.log(torch.bincount(torch.tensor(labels), minlength=classes).double())
    right = 0
    for text, label in zip(test, test_labels, strict=True):
        scores = log_p[:, byte_grams(text, order)].sum(1) + prior
        right += int(scores.argmax()) == label
    return right / len(test)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a folder in AG News's layout (default: the embedded set)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    folder = Path(args.data) if args.data else embedded_text_classes()
    data = load_agnews(folder)
    kept, _ = split_train(len(data.train))  # the neural runs' training examples
    train = data.train.subset(kept)
    labels, test_labels = torch.tensor(train.labels), torch.tensor(data.test.labels)
    majority = int(torch.bincount(labels).argmax())
    result = {
        "data": str(folder) if args.data else "the embedded gettext set",
        "sha256": {
            f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
            for f in ("train.csv", "test.csv")
        },
        "train_examples": len(labels),
        "test_examples": len(test_labels),
        "majority_accuracy": float((test_labels == majority).double().mean()),
    }
    for order, name in ((1, "bytes"), (2, "byte_bigrams")):
        result[f"naive_bayes_{name}_accuracy"] = naive_bayes_accuracy(
            train.texts,
            train.labels,
            data.test.texts,
            data.test.labels,
            order,
        )
    if not args.data:
        result["manifest"] = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if "accuracy" in k}, indent=2))


if __name__ == "__main__":
    main()
