"""``kattn generate``: a trained language-model run continues a prompt, reproducibly."""

from __future__ import annotations

import json

import pytest

from kattn.cli import main
from kattn.train.loop import train

from ..data.test_lm_data import write_text
from ..train.test_train_lm import tiny_lm
from ..train.test_train_loop import listops_dir, tiny  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    write_text(root / "corpus.txt", lines=300)
    train(tiny_lm(root / "corpus.txt", "train.steps=4"), root / "run", progress=False)
    return root / "run"


def _generate(capsys, run, *extra):
    argv = ["generate", "--run", str(run), "--prompt", "the ", "--max-new-tokens", "12", "--json"]
    assert main([*argv, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_continues_the_prompt_reproducibly(lm_run, capsys):
    first = _generate(capsys, lm_run, "--seed", "3", "--top-k", "5", "--num-samples", "2")
    again = _generate(capsys, lm_run, "--seed", "3", "--top-k", "5", "--num-samples", "2")
    assert first["samples"] == again["samples"] and len(first["samples"]) == 2
    assert all(s.startswith("the ") for s in first["samples"])
    assert first["new_tokens"] == 12 and first["prompt_tokens"] == 4
    assert first["strategy"] == "recurrent" and first["mechanism"] == "softmax"
    greedy = _generate(capsys, lm_run, "--temperature", "0")
    reencoded = _generate(capsys, lm_run, "--temperature", "0", "--strategy", "reencode")
    assert greedy["samples"] == reencoded["samples"]


def test_generate_prints_text_and_timing(lm_run, capsys):
    argv = ["generate", "--run", str(lm_run), "--prompt", "x", "--max-new-tokens", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("x") and "tokens/s" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--prompt", ""], "empty"), (["--top-p", "2"], "top_p"), (["--num-samples", "0"], "num")],
)
def test_generate_refuses_bad_flags(lm_run, capsys, extra, message):
    argv = ["generate", "--run", str(lm_run), "--prompt", "a", "--max-new-tokens", "2", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_generate_refuses_a_classification_run(listops_dir, tmp_path, capsys):  # noqa: F811
    train(tiny("listops", listops_dir, "train.steps=2"), tmp_path / "run", progress=False)
    assert main(["generate", "--run", str(tmp_path / "run"), "--prompt", "a"]) == 2
    assert "not a language-model run" in capsys.readouterr().err
