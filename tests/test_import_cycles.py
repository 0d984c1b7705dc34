"""kattn's modules import each other without a cycle.

The import graph is read from the source with ``ast``: every ``import``/``from ... import`` of a
kattn module, at module level and inside functions (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:``. An edge goes to the module named (``from .x import y`` →
``x``, or ``x.y`` when ``y`` is a submodule); the parent packages Python initialises on the way
are not edges (every module would then close a loop through ``kattn/__init__``).
"""

import ast
from pathlib import Path

import kattn

ROOT = Path(kattn.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported_modules(name: str) -> set[str]:
    """The kattn modules that module ``name`` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]))
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(parts + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in MODULES else target)
            else:
                visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in MODULES and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_graph_is_read():
    graph = {m: imported_modules(m) for m in MODULES}
    assert "kattn.registry" in graph["kattn.attention.softmax"]
    assert "kattn.attention" in graph["kattn"]


def test_no_import_cycle_among_kattns_modules():
    assert cycles({m: imported_modules(m) for m in MODULES}) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
