"""The documentation says what the code does: its examples compile and are run by tests,
its imports exist, and every `baton run` command it shows uses flags the recipe takes."""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from baton.core.cli.objective_flags import expand
from baton.core.cli.recipe import RecipeFlags
from baton.core.cli.recipe_signature import read_signature
from support.docs_examples import ROOT, docs_examples, pages

CODE_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks(language: str) -> list[tuple[Path, str]]:
    return [
        (page, code)
        for page in pages()
        for lang, code in CODE_BLOCK.findall(page.read_text())
        if lang == language
    ]


def test_every_python_example_compiles() -> None:
    for page, code in blocks("python"):
        try:
            ast.parse(code)
        except SyntaxError as error:
            pytest.fail(f"{page.relative_to(ROOT)}: a Python example does not parse: {error}")


def _defines(module_file: Path, name: str) -> bool:
    """Whether ``name`` is defined or imported at the top level of ``module_file``."""
    tree = ast.parse(module_file.read_text())
    for node in tree.body:
        targets: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            targets = [node.name]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                targets += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.ImportFrom | ast.Import):
            targets = [alias.asname or alias.name.split(".")[0] for alias in node.names]
        if name in targets:
            return True
        if "__all__" in targets and isinstance(node, ast.Assign | ast.AnnAssign):
            exported = ast.literal_eval(node.value) if node.value is not None else []
            if name in exported:  # a lazy export (the module's __getattr__)
                return True
    return False


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    for package in (ROOT / "packages").glob("*/src"):
        base = package.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def test_every_baton_import_in_the_docs_exists() -> None:
    """`from baton.x import Y` in an example names a module and a name that exist."""
    missing = []
    for page, code in blocks("python"):
        for node in ast.walk(ast.parse(code)):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("baton.")):
                continue
            module_file = _module_file(node.module or "")
            if module_file is None:
                missing.append(f"{page.name}: module {node.module}")
                continue
            for alias in node.names:
                sub = _module_file(f"{node.module}.{alias.name}")
                if sub is None and not _defines(module_file, alias.name):
                    missing.append(f"{page.name}: {node.module}.{alias.name}")
    assert not missing, f"the docs import what does not exist: {missing}"


def test_every_marked_example_is_run_by_a_test() -> None:
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    unrun = [name for name in docs_examples() if f'docs_example("{name}")' not in tests]
    assert not unrun, f"docs examples no test runs: {unrun}"


def _commands() -> list[tuple[Path, list[str]]]:
    """Every `baton run RECIPE ...` command of the shell examples, as argument lists."""
    found = []
    for page, code in blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", code)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip().rstrip("&").strip()
            words = line.split()
            if "run" not in words or not any(w.startswith("recipes/") for w in words):
                continue
            if line.startswith("..."):
                continue
            args = shlex.split(line)
            at = next(i for i, w in enumerate(args) if w.startswith("recipes/"))
            if args[at - 1] == "run":  # not `baton eval` or `baton submit`: their own flags
                found.append((page, args[at:]))
    return found


def test_every_documented_run_command_uses_flags_the_recipe_takes() -> None:
    common = {f.name for f in dataclasses.fields(RecipeFlags)} | {"help"}
    problems = []
    commands = _commands()
    assert len(commands) > 20, "the docs' shell examples were not found"
    for page, (recipe, *args) in commands:
        path = ROOT / recipe
        if not path.is_file():
            problems.append(f"{page.name}: no recipe {recipe}")
            continue
        signature = read_signature(path)
        assert signature is not None, recipe
        signature = expand(signature)  # an objective parameter brings its settings' flags
        names = {p.name for p in signature.params} | common
        for arg in args:
            if not arg.startswith("--"):
                continue
            name = arg[2:].split("=", 1)[0].replace("-", "_")
            if name not in names and not (name.startswith("no_") and name[3:] in names):
                problems.append(f"{page.name}: {recipe} takes no {arg.split('=', 1)[0]}")
    assert not problems, "\n".join(problems)


def test_reference_tables_are_read_from_the_code() -> None:
    from baton.core.abilities import ABILITY_HINTS
    from baton.core.registry import CALLBACKS
    from baton.tools.reference import fill, render

    callbacks = render("callbacks")
    assert all(f"| `{name}` |" in callbacks for name in CALLBACKS.names())
    abilities = render("abilities")
    assert all(f"| `{name}` |" in abilities for name in ABILITY_HINTS)
    assert "| `lr` |" in render("metrics")
    assert "`grad_norm/<group>`" in render("callback-metrics").replace("``", "`")
    with pytest.raises(KeyError, match="unknown reference table 'nope'"):
        fill("<!-- reference: nope -->")


def test_the_readme_stays_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    pages_of_the_site = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages_of_the_site <= linked, (
        f"pages the README does not link: {pages_of_the_site - linked}"
    )
