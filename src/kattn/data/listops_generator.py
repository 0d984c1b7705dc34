"""LRA ListOps's generator (implementation notes §D.3) and the writer of the released format.

:func:`generate_listops` re-implements LRA's generator: random nested expressions of MIN, MAX,
MED and SM, kept when their length falls in a window and their string is new, with their
values. :func:`write_listops` writes them as the released ``basic_{train,val,test}.tsv``,
which :func:`kattn.data.listops.load_listops` reads. :mod:`kattn.data.listops` re-exports this
module's public names.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TypeAlias

import numpy as np

from ..checks import int_at_least

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
#: below ``max_depth``, a node is an operator with this probability and a digit otherwise.
VALUE_P = 0.25
_DIGITS = range(10)

#: A generated expression as LRA builds it: a digit, or the left-nested pairs
#: ``((((op, a1), a2), …, ak), END)`` of an operator and its arguments.
Tree: TypeAlias = "int | str | tuple[Tree, Tree]"

_FUNCTIONS: dict[str, Callable[[list[int]], int]] = {
    "[MIN": min,
    "[MAX": max,
    # np.median gives x.5 for an even count; LRA's int() truncates it (values are >= 0)
    "[MED": lambda values: int(np.median(values)),
    "[SM": lambda values: sum(values) % 10,
}

#: split → released file name (in ``listops-1000/``).
LISTOPS_FILES = {"train": "basic_train.tsv", "valid": "basic_val.tsv", "test": "basic_test.tsv"}
_HEADER = "Source\tTarget"


def generate_tree(
    rng: random.Random, depth: int = 1, *, max_depth: int = 10, max_args: int = 10
) -> tuple[Tree, int]:
    """A random expression and its length in tokens (operators, digits and ``]``; no parens).

    LRA's recursion: below ``max_depth`` draw r ~ U[0, 1), at it r = 1; if r > ``VALUE_P`` the
    node is a uniform digit (length 1), else a uniform operator with ``k ~ U{2, …, max_args}``
    arguments generated at ``depth + 1`` (length 2 + their lengths). The draws are LRA's calls
    in LRA's order (``random``, ``choice``, ``randint``, ``choice``), so the same
    ``random.Random`` state gives the same trees.

    Args:
        rng: the source of randomness.
        depth: the depth of this node; LRA starts the root at 1.
        max_depth: nodes at this depth are digits.
        max_args: the most arguments of an operator.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.choice(_DIGITS), 1
    length = 2
    children = []
    for _ in range(rng.randint(2, max_args)):
        child, child_length = generate_tree(rng, depth + 1, max_depth=max_depth, max_args=max_args)
        children.append(child)
        length += child_length
    tree: Tree = rng.choice(OPERATORS)
    for child in children:
        tree = (tree, child)
    return (tree, END), length


def to_string(tree: Tree) -> str:
    """LRA's serialisation: every pair written ``( x y )``, tokens separated by one space, so
    ``[MAX 2 9 ]`` (the tree ``((("[MAX", 2), 9), "]")``) is ``( ( ( [MAX 2 ) 9 ) ] )``."""
    parts: list[str] = []
    _serialise(tree, parts)
    return " ".join(parts)


def _serialise(tree: Tree, parts: list[str]) -> None:
    if isinstance(tree, tuple):
        parts.append("(")
        _serialise(tree[0], parts)
        _serialise(tree[1], parts)
        parts.append(")")
    else:
        parts.append(str(tree))


def tree_value(tree: Tree) -> int:
    """The value of an expression: MIN, MAX, MED (the median truncated to an int, as LRA's
    ``int(np.median(...))``) or SM (the sum mod 10) of its arguments' values."""
    if isinstance(tree, int):
        return tree
    if isinstance(tree, str) or tree[1] != END:
        raise ValueError(f"not a ListOps expression (a digit or (..., {END!r})): {tree!r}")
    args = []
    node = tree[0]
    while isinstance(node, tuple):  # unwind ((op, a1), a2) ... from the last argument
        args.append(tree_value(node[1]))
        node = node[0]
    if not isinstance(node, str) or node not in _FUNCTIONS:
        raise ValueError(f"not a ListOps operator: {node!r} (expected one of {OPERATORS})")
    return _FUNCTIONS[node](args[::-1])


def generate_listops(
    num_train: int,
    num_valid: int,
    num_test: int,
    *,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    max_attempts: int | None = None,
) -> dict[str, list[tuple[str, int]]]:
    """LRA's ListOps generator: distinct random expressions of ``min_length < length <
    max_length`` tokens and their values, split into train, valid and test.

    Trees are drawn with :func:`generate_tree` from ``random.Random(seed)`` and kept when their
    length (tokens without parentheses) is strictly inside the window and their string is new.
    The defaults are LRA's (``listops-1000``: 96,000 / 2,000 / 2,000). Unlike LRA, which splits
    a Python ``set`` in its hash order, the splits follow the order of generation, so a seed
    gives the same data in every run.

    Args:
        num_train, num_valid, num_test: the split sizes.
        min_length, max_length: the exclusive bounds of the length.
        max_depth, max_args: see :func:`generate_tree`.
        seed: seeds the generator.
        max_attempts: how many trees to draw before giving up; default ``max(100_000, 100 ×
            total)``, which refuses windows that keep fewer than 1 % of the trees (LRA's keep
            about 8 %).

    Returns:
        ``{"train": [(source, label), …], "valid": …, "test": …}``.

    Raises:
        ValueError: a size or option is out of range, no tree length fits the window, or the
            window yields too few distinct trees within ``max_attempts``.
    """
    sizes = {"num_train": num_train, "num_valid": num_valid, "num_test": num_test}
    for name, value in sizes.items():
        int_at_least(name, value, 0)
    int_at_least("max_depth", max_depth, 1)
    int_at_least("max_args", max_args, 2)
    _check_window(min_length, max_length, max_depth, max_args)
    total = num_train + num_valid + num_test
    limit = max(100_000, 100 * total) if max_attempts is None else max_attempts
    rng = random.Random(seed)
    pool: dict[str, int] = {}  # insertion-ordered, unlike LRA's set
    attempts = 0
    while len(pool) < total:
        if attempts >= limit:
            raise ValueError(
                f"found only {len(pool)} of {total} distinct expressions with min_length="
                f"{min_length} < length < max_length={max_length} in {attempts} trees "
                f"(max_depth={max_depth}, max_args={max_args}); widen the length window, "
                f"change max_depth or max_args, ask for fewer examples or raise max_attempts"
            )
        attempts += 1
        tree, length = generate_tree(rng, max_depth=max_depth, max_args=max_args)
        if min_length < length < max_length:
            source = to_string(tree)
            if source not in pool:
                pool[source] = tree_value(tree)
    examples = list(pool.items())
    cut = (num_train, num_train + num_valid)
    return {
        "train": examples[: cut[0]],
        "valid": examples[cut[0] : cut[1]],
        "test": examples[cut[1] :],
    }


def write_listops(
    out_dir: str | PathLike[str], splits: Mapping[str, Sequence[tuple[str, int]]]
) -> dict[str, Path]:
    """Write ``splits`` (as :func:`generate_listops` returns) as the released files.

    Writes ``basic_{train,val,test}.tsv`` in ``out_dir`` (created if needed) as LRA's writer
    does (Python ``csv``, tab-delimited): the header ``Source<TAB>Target`` and one
    ``source<TAB>label`` row per example, each line ended by ``\\r\\n``.

    Returns:
        split → the path written.

    Raises:
        ValueError: the keys are not train, valid and test, a source holds a tab or a line
            break, or a label is not an int in 0–9.
    """
    if set(splits) != set(LISTOPS_FILES):
        raise ValueError(f"splits must have the keys {sorted(LISTOPS_FILES)}, got {sorted(splits)}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, name in LISTOPS_FILES.items():
        rows = [_HEADER]
        for i, (source, label) in enumerate(splits[split]):
            if any(c in source for c in "\t\r\n"):
                raise ValueError(f"{split} example {i}: the source holds a tab or a line break")
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
                raise ValueError(f"{split} example {i}: label {label!r} is not an int in 0-9")
            if not 0 <= label <= 9:
                raise ValueError(f"{split} example {i}: label {label!r} is not an int in 0-9")
            rows.append(f"{source}\t{int(label)}")
        paths[split] = folder / name
        with paths[split].open("w", encoding="utf-8", newline="") as file:
            file.write("".join(row + "\r\n" for row in rows))
    return paths


def _check_window(min_length: int, max_length: int, max_depth: int, max_args: int) -> None:
    """Refuse windows no tree fits: lengths are >= 1 and at most the full tree's length."""
    int_at_least("min_length", min_length, -(2**63))
    int_at_least("max_length", max_length, -(2**63))
    if max_length - min_length < 2 or max_length <= 1:
        raise ValueError(
            f"no length satisfies min_length={min_length} < length < max_length={max_length} "
            f"(lengths are whole numbers >= 1); choose max_length >= min_length + 2"
        )
    longest = 1  # an operator with max_args children at each depth below max_depth
    for _ in range(max_depth - 1):
        longest = 2 + max_args * longest
    if longest <= min_length:
        raise ValueError(
            f"no tree is longer than min_length={min_length}: with max_depth={max_depth} and "
            f"max_args={max_args} the longest has {longest} tokens; lower min_length or raise "
            f"max_depth or max_args"
        )
