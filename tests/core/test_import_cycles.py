"""No runtime import cycle anywhere in ``packages/``.

Every module's imports are read from its source (``ast``): ``import a.b`` and ``from
a.b import c`` import ``a.b`` (and ``a.b.c`` when that is a module); imports inside
functions count (a lazy import that only breaks a loop at import time is still a
loop), imports under ``if TYPE_CHECKING:`` do not (they never run). A cycle is a set
of modules that import each other, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2] / "packages"

#: cycles that still exist in the backends, each as its sorted modules (being split
#: apart); a cycle fixed must leave this list, a new one must not join it
KNOWN_CYCLES: set[tuple[str, ...]] = {
    ("baton.backends.megatron", "baton.backends.megatron.patches"),
    ("baton.backends.torchtitan.data", "baton.backends.torchtitan.prepared"),
}


def module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for src in PACKAGES.glob("*/src"):
        for file in src.rglob("*.py"):
            parts = file.relative_to(src).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = file
    return modules


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skipped


def imports_of(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``packages/`` that module ``name`` imports when it runs."""
    tree = ast.parse(file.read_text())
    skipped = _type_checking_only(tree)
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found.update(t for t in targets if t in modules and t != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, file, modules) for name, file in modules.items()}


def test_the_cycle_finder_finds_a_cycle_through_a_package() -> None:
    graph = {"a": {"a.b"}, "a.b": {"a.c"}, "a.c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [("a", "a.b", "a.c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions_but_not_type_checking_ones() -> None:
    graph = import_graph()
    assert "baton.core.driver" in graph["baton.core"]  # the package exports Driver
    # baton.core.callback names Driver only for the type checker
    assert "baton.core.driver" not in graph["baton.core.callback"]


def test_no_runtime_import_cycle_in_packages() -> None:
    found = set(cycles(import_graph()))
    new = sorted(found - KNOWN_CYCLES)
    assert not new, (
        "runtime import cycles (modules that import each other): "
        + "; ".join(" <-> ".join(c) for c in new)
        + ". Move what both need into a module of its own, or import it under "
        "TYPE_CHECKING when only the type checker needs it"
    )
    gone = sorted(KNOWN_CYCLES - found)
    assert not gone, f"cycles fixed, remove them from KNOWN_CYCLES: {gone}"
