"""A recipe's parameters read from its source, without running it.

``baton run recipes/x.py --help`` (and flag parsing) must not wait for torch or jax
to import: the recipe file is parsed with ``ast``, and each parameter's annotation and
default are evaluated with only builtins, ``typing`` and ``pathlib.Path`` in scope.
Help text per parameter comes from the recipe's docstring (``Args:`` section, Google,
NumPy or reST style, as ``tyro.cli(fn)`` reads it).

Example::

    signature = read_signature(Path("recipes/quickstart.py"))
    signature.params[0]     # Param(name='max_steps', annotation=int, default=300, help='...')
    signature.summary       # the docstring's first paragraph

Returns ``None`` when the source cannot be read this way (a default that is not a
literal, an annotation naming the recipe's own classes): the caller then imports the
recipe and inspects the function.

A recipe decorated ``@extends("base.py")`` (``baton.core.cli.recipe_extension``) has the
wrapped recipe's parameters and then its own, after its first (the driver).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import docstring_parser

from baton.core.errors import RecipeError
from baton.core.objectives import ObjectiveRun

#: what an annotation may name when read from source
_ANNOTATION_SCOPE: dict[str, Any] = {
    **{name: getattr(typing, name) for name in cast(list[str], typing.__all__)},
    "Path": pathlib.Path,
    "pathlib": pathlib,
    "typing": typing,
}


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """``Annotated[int, AtLeast(1)]``: the parameter's lowest accepted value."""

    minimum: float


_ANNOTATION_SCOPE["AtLeast"] = AtLeast
#: a recipe's objective parameter (``objective: ObjectiveRun | str = "pretrain"``)
_ANNOTATION_SCOPE["ObjectiveRun"] = ObjectiveRun

#: the name of ``recipe_extension``'s decorator, as a recipe's source spells it
EXTENDS = "extends"


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    annotation: Any
    default: Any  # dataclasses.MISSING when required
    help: str = ""


@dataclasses.dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    summary: str
    description: str


def help_by_name(doc: str) -> dict[str, str]:
    """Each parameter's help from a docstring's ``Args:`` section, on one line."""
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return {}
    return {p.arg_name: " ".join((p.description or "").split()) for p in parsed.params}


def summary_of(doc: str) -> str:
    """A docstring's description without its ``Args:`` section."""
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return doc.strip()
    parts = [parsed.short_description or "", parsed.long_description or ""]
    # a first paragraph over several lines is one paragraph, not a summary line and another
    joint = "\n\n" if parsed.blank_after_short_description else "\n"
    return joint.join(p for p in parts if p)


def read_signature(path: Path, function: str = "recipe") -> Signature | None:
    """Parameters of ``function`` in the file at ``path``, or ``None`` if not literal."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None  # importing reports it properly
    node = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None
    )
    if node is None or node.args.vararg or node.args.posonlyargs or node.args.kwarg:
        return None
    base = _extended_recipe(node)
    if base is not None and not node.args.args:
        return None
    doc = ast.get_docstring(node) or ""
    helps = help_by_name(doc)
    positional = node.args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(node.args.defaults))
    defaults += list(node.args.defaults)
    pairs = list(zip(positional, defaults, strict=True))
    if base is not None:
        pairs = pairs[1:]  # the wrapped recipe's driver
    pairs += list(zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True))
    params: list[Param] = []
    for arg, default_node in pairs:
        if arg.annotation is None:
            return None
        try:
            annotation = eval(
                compile(ast.Expression(arg.annotation), str(path), "eval"),
                {"__builtins__": __builtins__, **_ANNOTATION_SCOPE},
            )
            default = (
                dataclasses.MISSING if default_node is None else ast.literal_eval(default_node)
            )
        except Exception:
            return None
        if isinstance(annotation, str):
            return None
        params.append(Param(arg.arg, annotation, default, helps.get(arg.arg, "")))
    own = Signature(tuple(params), summary_of(doc), doc)
    if base is None:
        return own
    try:
        base_path = base_recipe_path(base, path.parent)
    except RecipeError:
        return None  # importing reports it
    wrapped = read_signature(base_path)
    return None if wrapped is None else extend_signature(wrapped, own)


def _extended_recipe(node: ast.FunctionDef) -> str | None:
    """The path in an ``@extends("...")`` decorator of ``node``, if it has one."""
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call) or len(decorator.args) != 1:
            continue
        name = decorator.func
        called = name.id if isinstance(name, ast.Name) else getattr(name, "attr", None)
        argument = decorator.args[0]
        if called == EXTENDS and isinstance(argument, ast.Constant):
            return str(cast(object, argument.value))
    return None


def base_recipe_path(base: str | Path, folder: Path) -> Path:
    """The wrapped recipe's file: ``base`` relative to ``folder`` (the new recipe's), else
    as given (relative to the working directory); an error when neither exists."""
    for candidate in (folder / base, Path(base)):
        if candidate.is_file():
            return candidate
    raise RecipeError(
        f"@{EXTENDS}({str(base)!r}): no recipe file there (looked in {folder} and the "
        "working directory); give the wrapped recipe's path relative to this recipe"
    )


def extend_signature(base: Signature, own: Signature) -> Signature:
    """The wrapped recipe's parameters, then the new one's; a shared name takes the new
    default (and help, where it has one). The summary is the new recipe's."""
    mine = {p.name: p for p in own.params}
    params = [
        dataclasses.replace(p, default=mine[p.name].default, help=mine[p.name].help or p.help)
        if p.name in mine
        else p
        for p in base.params
    ]
    shared = {p.name for p in base.params}
    params += [p for p in own.params if p.name not in shared]
    return Signature(tuple(params), own.summary or base.summary, own.description)


def signature_of(fn: Callable[..., Any], *, skip: int = 0) -> Signature:
    """The same, from an imported function (any defaults and annotations), its first
    ``skip`` parameters left out; an ``@extends`` recipe's own ``recipe_signature``."""
    declared = getattr(fn, "recipe_signature", None)
    if isinstance(declared, Signature):
        return declared
    doc = inspect.getdoc(fn) or ""
    helps = help_by_name(doc)
    params: list[Param] = []
    listed = list(inspect.signature(fn).parameters.values())[skip:]
    if any(p.kind is p.VAR_KEYWORD for p in listed):
        raise RecipeError(
            "recipe() takes **keywords, whose flags the command line cannot know; to build "
            f'on another recipe and keep its flags, decorate it: @{EXTENDS}("base_recipe.py") '
            "def recipe(driver: Driver, ...) (baton.core.cli.recipe_extension)"
        )
    hints = typing.get_type_hints(fn, include_extras=True) if listed else {}
    for param in listed:
        if param.kind is param.VAR_POSITIONAL:
            continue
        if param.name not in hints:
            raise RecipeError(
                f"recipe parameter {param.name!r} needs a type annotation for the command line"
            )
        default = dataclasses.MISSING if param.default is param.empty else param.default
        params.append(Param(param.name, hints[param.name], default, helps.get(param.name, "")))
    return Signature(tuple(params), summary_of(doc), doc)
