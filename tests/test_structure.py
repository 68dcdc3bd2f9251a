"""The shape of every package in ``packages/``: small modules, classes and functions, and no
import cycles (a lazy import inside a function counts: it still ties the two modules
together; a package importing its own submodule counts too). Imports under
``if TYPE_CHECKING:`` are left out: they never run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "callbacks", "data", "backends", "tools")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
#: a function or method, measured like a class: from ``def`` to its last line
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        src = ROOT / "packages" / package / "src"
        for file in src.rglob("*.py"):
            name = ".".join(file.relative_to(src).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = file
    return found


def imported(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``file`` imports at run time (``from a import b``: ``a`` and,
    if it is a module, ``a.b``)."""
    tree = ast.parse(file.read_text())
    skipped = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {t for t in targets if t in known and t != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_a_cycle_through_a_package_is_found() -> None:
    graph = {"a": {"a.b"}, "a.b": {"a.c"}, "a.c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "a.b", "a.c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count_and_type_checking_ones_do_not() -> None:
    known = modules()
    # baton.core exports Driver; baton.core.callback names Driver for the type checker only
    assert "baton.core.driver" in imported("baton.core", known["baton.core"], known)
    callback = known["baton.core.callback"]
    assert "baton.core.driver" not in imported("baton.core.callback", callback, known)


def test_no_import_cycles() -> None:
    known = modules()
    assert {name.split(".")[1] for name in known} == {*PACKAGES}  # every package was read
    graph = {name: imported(name, file, known) for name, file in known.items()}
    assert cycles(graph) == []


def test_modules_classes_and_functions_stay_small() -> None:
    """Smoke detectors, not targets: a unit past its limit is split by responsibility."""
    too_big = []
    for file in modules().values():
        text = file.read_text()
        where = file.relative_to(ROOT)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_big.append(f"{where}:{node.name}: {size} lines")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    too_big.append(f"{where}:{node.name}(): {size} lines")
    assert too_big == []
