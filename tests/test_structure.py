"""The shape of every package in ``packages/``: no import cycles (a lazy import inside a
function counts: it still ties the two modules together; a package importing its own
submodule counts too; so do imports under ``if TYPE_CHECKING:``, which tie two modules
together for the reader as much as any: a part that names its host's type for its
annotations still reaches back into it),
and a smoke detector for size: the largest module, class and function are printed, and
only a module or function well past any reasonable size fails (a class has no cap: its
size is its methods'). Nothing is split to satisfy it; a split follows a job."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "callbacks", "data", "backends", "tools")
#: the smoke detector's alarms, well past the largest unit today (printed by the test)
MAX_MODULE_LINES = 800
#: a function or method, from ``def`` to its last line
MAX_FUNCTION_LINES = 100


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        src = ROOT / "packages" / package / "src"
        for file in src.rglob("*.py"):
            name = ".".join(file.relative_to(src).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = file
    return found


def imported(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``file`` imports, at run time or for the type checker
    (``from a import b``: ``a`` and, if it is a module, ``a.b``)."""
    tree = ast.parse(file.read_text())
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        found: set[str] = set()
        if isinstance(node, ast.Import):
            found = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found = {base} | {f"{base}.{alias.name}" for alias in node.names}
        targets |= found
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


def test_imports_inside_functions_and_for_types_count_but_the_hooks_driver() -> None:
    known = modules()
    # baton.core exports Driver; baton.core.callback names Driver for its hooks' types
    assert "baton.core.driver" in imported("baton.core", known["baton.core"], known)
    callback = known["baton.core.callback"]
    assert "baton.core.driver" not in imported("baton.core.callback", callback, known)
    # a type-only import of anything else counts: callback.py names Ability for types
    assert "baton.core.abilities" in imported("baton.core.callback", callback, known)


def test_no_import_cycles() -> None:
    known = modules()
    assert {name.split(".")[1] for name in known} == {*PACKAGES}  # every package was read
    graph = {name: imported(name, file, known) for name, file in known.items()}
    assert cycles(graph) == []


def sizes() -> dict[str, list[tuple[int, str]]]:
    """Every module's, class's and function's length in lines, with where it is."""
    found: dict[str, list[tuple[int, str]]] = {"module": [], "class": [], "function": []}
    for file in modules().values():
        text = file.read_text()
        where = str(file.relative_to(ROOT))
        found["module"].append((len(text.splitlines()), where))
        for node in ast.walk(ast.parse(text)):
            kind = (
                "class"
                if isinstance(node, ast.ClassDef)
                else "function"
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                else None
            )
            if kind is not None:
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found[kind].append((size, f"{where}:{node.name}"))
    return found


def test_no_module_or_function_is_far_too_big() -> None:
    """A smoke detector, not a target: the largest of each kind is printed (``pytest -s``);
    a module past ``MAX_MODULE_LINES`` or a function past ``MAX_FUNCTION_LINES`` fails."""
    found = sizes()
    for kind, measured in found.items():
        size, where = max(measured)
        print(f"largest {kind}: {where} ({size} lines)")
    limits = {"module": MAX_MODULE_LINES, "function": MAX_FUNCTION_LINES}
    too_big = [
        f"{where}: {size} lines (the {kind} alarm is at {limits[kind]})"
        for kind in limits
        for size, where in found[kind]
        if size > limits[kind]
    ]
    assert too_big == []
