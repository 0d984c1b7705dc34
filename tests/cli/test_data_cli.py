"""``kattn data generate``: the parser of :mod:`kattn.cli.data` and what its handlers write."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kattn.cli.data import add_data_parser
from kattn.data import LISTOPS_FILES, load_listops, load_pathfinder
from kattn.data.pathfinder import LEVELS

SMALL_LISTOPS = ["--train", "40", "--valid", "5", "--test", "5", "--min-length", "5",
                 "--max-length", "30", "--max-depth", "3"]  # fmt: skip


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kattn")
    sub = parser.add_subparsers(dest="command", required=True)
    add_data_parser(sub)
    return parser.parse_args(argv)


def _run(argv: list[str]) -> int:
    args = _parse(argv)
    return int(args.func(args))


def _listops(out: Path, seed: int) -> int:
    return _run(["data", "generate", "listops", "--out", str(out), *SMALL_LISTOPS,
                 "--seed", str(seed)])  # fmt: skip


def _files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in LISTOPS_FILES.values()}


def test_listops_defaults_are_lra_release() -> None:
    args = _parse(["data", "generate", "listops", "--out", "x"])
    assert (args.train, args.valid, args.test) == (96_000, 2_000, 2_000)
    assert (args.min_length, args.max_length, args.max_depth, args.max_args) == (500, 2000, 10, 10)
    assert args.seed == 0 and args.out == Path("x")


def test_listops_writes_released_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _listops(tmp_path, seed=1) == 0
    sizes = {"train": 40, "valid": 5, "test": 5}
    for split, name in LISTOPS_FILES.items():
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert lines[0] == "Source\tTarget"
        assert len(lines) == 1 + sizes[split]
    data = load_listops(tmp_path, max_len=30)
    assert (len(data.train), len(data.valid), len(data.test)) == (40, 5, 5)
    out = capsys.readouterr()
    for name in LISTOPS_FILES.values():
        assert f"{tmp_path / name}: " in out.out
    assert "40 examples" in out.out and "5 examples" in out.out
    assert "train classes:" in out.out
    assert "majority-class baseline (test)" in out.out
    assert "generating 50 ListOps expressions" in out.err


def test_listops_same_seed_same_bytes(tmp_path: Path) -> None:
    _listops(tmp_path / "a", seed=1)
    _listops(tmp_path / "b", seed=1)
    _listops(tmp_path / "c", seed=2)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")


def test_listops_impossible_window_raises(tmp_path: Path) -> None:
    args = _parse(["data", "generate", "listops", "--out", str(tmp_path), "--min-length", "50",
                   "--max-length", "52", "--max-depth", "1"])  # fmt: skip
    with pytest.raises(ValueError, match="min_length"):
        args.func(args)
    assert not any(tmp_path.iterdir())


def test_pathfinder_writes_released_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["data", "generate", "pathfinder", "--out", str(tmp_path), "--count", "6",
            "--contour-length", "6", "--batch-size", "4", "--seed", "3"]  # fmt: skip
    assert _run(argv) == 0
    level = tmp_path / LEVELS[6]
    assert level.name == "curv_baseline"
    assert sorted(p.relative_to(level).as_posix() for p in level.rglob("*.png")) == [
        "imgs/0/sample_0.png", "imgs/0/sample_1.png", "imgs/0/sample_2.png",
        "imgs/0/sample_3.png", "imgs/1/sample_0.png", "imgs/1/sample_1.png",
    ]  # fmt: skip
    assert sorted(p.name for p in (level / "metadata").glob("*.npy")) == ["0.npy", "1.npy"]
    data = load_pathfinder(tmp_path, level="curv_baseline", split=(1.0, 0.0, 0.0))
    assert len(data.train) == 6  # (80/10/10 of 6 images would leave valid empty: refused)
    assert f"wrote {level}: 6 images" in capsys.readouterr().out


def test_pathfinder_defaults_and_contour_length_choices() -> None:
    args = _parse(["data", "generate", "pathfinder", "--out", "x"])
    assert (args.count, args.contour_length, args.seed) == (1000, 14, 0)
    assert (args.image_size, args.batch_size) == (32, 1000)
    with pytest.raises(SystemExit):
        _parse(["data", "generate", "pathfinder", "--out", "x", "--contour-length", "7"])


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "generate"],
        ["data", "generate", "imdb", "--out", "x"],
        ["data", "generate", "listops"],
        ["data", "generate", "pathfinder", "--train", "5", "--out", "x"],
    ],
    ids=["no-dataset", "unknown-dataset", "no-out", "listops-option-on-pathfinder"],
)
def test_parser_rejects(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
