"""The command line lives in one package, ``kattn.cli``: no other module of the library imports
``argparse`` or ``kattn.cli`` (the library takes typed arguments; the command parses flags)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "kattn"
FORBIDDEN = ("argparse", "kattn.cli")
#: ``python -m kattn`` runs the command: the one module outside the package that may import it
ENTRY_POINT = "kattn.__main__"


def module_name(path: Path) -> str:
    """``kattn.a.b`` of ``src/kattn/a/b.py`` (``kattn.a`` of ``src/kattn/a/__init__.py``)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module name an ``import`` or ``from ... import`` anywhere in ``source`` (inside
    functions too) may load, relative imports resolved against ``module``; for
    ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a submodule)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)
    return found


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def scan() -> dict[str, list[str]]:
    """The forbidden imports of every module of ``src/kattn``, by module name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        names = imported(path.read_text(), name, is_package=path.name == "__init__.py")
        found[name] = forbidden(names)
    return found


def in_cli(module: str) -> bool:
    return module == "kattn.cli" or module.startswith("kattn.cli.")


def test_only_the_cli_package_imports_argparse_or_the_cli():
    found = scan()
    outside = {m: names for m, names in found.items() if names and not in_cli(m)}
    assert outside == {ENTRY_POINT: ["kattn.cli", "kattn.cli.main"]}, (
        "move the command-line code into kattn/cli/ and call the library with typed "
        f"arguments: {outside}"
    )


def test_the_scan_sees_the_cli_package():
    found = scan()
    cli = [m for m in found if in_cli(m)]
    assert {"kattn.cli", "kattn.cli.types", "kattn.cli.train"} <= set(cli)
    assert all("argparse" in found[m] for m in ("kattn.cli", "kattn.cli.types"))


@pytest.mark.parametrize(
    "source, module, is_package, expected",
    [
        ("import argparse", "kattn.bench.x", False, {"argparse"}),
        ("import argparse.foo as f", "kattn.x", False, {"argparse.foo"}),
        ("from argparse import Namespace", "kattn.x", False, {"argparse", "argparse.Namespace"}),
        ("from .. import cli", "kattn.bench.x", False, {"kattn", "kattn.cli"}),
        ("from ..cli.types import device", "kattn.bench.x", False,
         {"kattn.cli.types", "kattn.cli.types.device"}),
        ("from . import cli", "kattn", True, {"kattn", "kattn.cli"}),
        ("from .cli import main", "kattn.__main__", False, {"kattn.cli", "kattn.cli.main"}),
        ("def f():\n    from kattn.cli import main\n", "kattn.x", False,
         {"kattn.cli", "kattn.cli.main"}),
        ("from .clip import x", "kattn.nn.y", False, {"kattn.nn.clip", "kattn.nn.clip.x"}),
    ],
    ids=["import", "import-submodule", "from-import", "relative-parent", "relative-deep",
         "package-init", "main-module", "inside-a-function", "similar-name"],
)  # fmt: skip
def test_imports_are_found_and_relative_ones_resolved(source, module, is_package, expected):
    assert imported(source, module, is_package) == expected


def test_similar_names_are_not_forbidden():
    assert forbidden({"kattn.client", "argparsex", "kattn.nn.clip"}) == []
    assert forbidden({"kattn.cli", "argparse.Namespace"}) == ["argparse.Namespace", "kattn.cli"]
